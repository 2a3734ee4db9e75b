"""F.nn.nll_loss, smooth_l1_loss, kl_div, ctc_loss, cosine_similarity
against PyTorch (float64, values and gradients, every reduction), and the
CTCLoss ops against finite differences (check_op)."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.testing import check_op, gradcheck, gradgradcheck

torch = pytest.importorskip("torch")
TF = torch.nn.functional
TOL = dict(rtol=1e-6, atol=1e-8)
REDUCTIONS = ["mean", "sum", "none"]


def _compare(fn_gc, fn_t, arrays, wrt, seed=0):
    """Values, and gradients of sum(out * w) for inputs ``wrt``."""
    xs = [gc.tensor(a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=i in wrt) for i, a in enumerate(arrays)]
    gm = gc.GradManager().attach([xs[i] for i in wrt])
    with gm:
        out = fn_gc(*xs)
        w = np.random.default_rng(seed).standard_normal(out.shape)
        gm.backward(F.sum(out * gc.tensor(w)))
    out_t = fn_t(*ts)
    (out_t * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(out.numpy(), out_t.detach().numpy(), **TOL)
    for i in wrt:
        np.testing.assert_allclose(xs[i].grad.numpy(), ts[i].grad.numpy(), **TOL)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction, weighted):
    rng = np.random.default_rng(0)
    x = np.log(rng.dirichlet(np.ones(4), size=(5,)))
    t = np.array([0, 3, 1, -100, 3])
    w = rng.uniform(0.5, 2, 4)
    extra = [w] if weighted else []

    def g(x, t, *w):
        return F.nn.nll_loss(x, t, w[0] if w else None, reduction=reduction)

    def tf(x, t, *w):
        return TF.nll_loss(x, t, w[0] if w else None, reduction=reduction)
    _compare(g, tf, [x, t] + extra, [0])


def test_nll_loss_spatial_and_errors():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 2, 2))
    t = rng.integers(0, 3, (2, 2, 2))
    for red in REDUCTIONS:
        _compare(lambda x, t: F.nn.nll_loss(x, t, reduction=red), lambda x, t: TF.nll_loss(x, t, reduction=red),
                 [x, t], [0])
    with pytest.raises(IndexError, match=r"nll_loss: target values must be in \[0, 3\)"):
        F.nn.nll_loss(gc.tensor(x), gc.tensor(t + 1))
    with pytest.raises(ValueError, match=r"nll_loss: expected input \(N, C, ...\)"):
        F.nn.nll_loss(gc.tensor(x), gc.tensor(t[0]))
    with pytest.raises(ValueError, match="reduction"):
        F.nn.nll_loss(gc.tensor(x), gc.tensor(t), reduction="avg")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("beta", [1.0, 0.3, 0.0])
def test_smooth_l1_loss(reduction, beta):
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((3, 4)) * 2, rng.standard_normal((3, 4))
    _compare(lambda a, b: F.nn.smooth_l1_loss(a, b, reduction, beta),
             lambda a, b: TF.smooth_l1_loss(a, b, reduction=reduction, beta=beta), [x, y], [0, 1])
    with pytest.raises(ValueError, match="smooth_l1_loss: target must have input's shape"):
        F.nn.smooth_l1_loss(gc.tensor(x), gc.tensor(y[:, :2]))


@pytest.mark.parametrize("reduction", REDUCTIONS + ["batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(reduction, log_target):
    rng = np.random.default_rng(3)
    x = np.log(rng.dirichlet(np.ones(5), size=4))
    p = rng.dirichlet(np.ones(5), size=4)
    y = np.log(p) if log_target else p
    _compare(lambda a, b: F.nn.kl_div(a, b, reduction, log_target),
             lambda a, b: TF.kl_div(a, b, reduction=reduction, log_target=log_target), [x, y], [0, 1])


def test_kl_div_zero_target_is_zero_not_nan():
    x = gc.tensor(np.log([[0.5, 0.5]]))
    out = F.nn.kl_div(x, gc.tensor([[1.0, 0.0]]), reduction="none")
    ref = TF.kl_div(torch.tensor(np.log([[0.5, 0.5]])), torch.tensor([[1.0, 0.0]], dtype=torch.float64),
                    reduction="none")
    np.testing.assert_allclose(out.numpy(), ref.numpy())


@pytest.mark.parametrize("shapes,axis", [(((4, 3), (4, 3)), 1), (((2, 3, 4), (1, 3, 4)), 1),
                                         (((5, 3), (5, 3)), 0), (((2, 6), (6,)), -1)])
def test_cosine_similarity(shapes, axis):
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal(s) for s in shapes)
    _compare(lambda a, b: F.nn.cosine_similarity(a, b, axis), lambda a, b: TF.cosine_similarity(a, b, axis),
             [a, b], [0, 1])
    assert gradgradcheck(lambda a, b: F.nn.cosine_similarity(a, b, axis), [gc.tensor(a), gc.tensor(b)])


def test_cosine_similarity_zero_vector_and_errors():
    z = F.nn.cosine_similarity(gc.tensor([[0.0, 0.0]]), gc.tensor([[1.0, 2.0]]))
    assert z.numpy().tolist() == [0.0]
    with pytest.raises(ValueError, match="cosine_similarity: x1 and x2 must broadcast"):
        F.nn.cosine_similarity(gc.tensor(np.zeros((2, 3))), gc.tensor(np.zeros((2, 4))))


# ---------------------------------------------------------------- CTC
def _ctc_data(seed=0, T=12, N=3, C=5, S=4):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((T, N, C))
    tl = np.array([4, 2, 3])[:N]
    targets = rng.integers(1, C, (N, S))
    targets[0, 1] = targets[0, 0]           # a repeated label: needs a blank between
    il = np.array([T, T - 3, T - 1])[:N]
    return logits, targets, il, tl


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("blank", [0, 4])
def test_ctc_loss_through_log_softmax_matches_torch(reduction, blank):
    logits, targets, il, tl = _ctc_data()
    if blank:
        targets = np.where(targets == blank, 1, targets)

    def g(x):      # MegEngine's signature: probabilities, their lengths, the labels, theirs
        return F.nn.ctc_loss(F.softmax(x, 2), gc.tensor(il), gc.tensor(targets), gc.tensor(tl), blank,
                             reduction)

    def tf(x):
        return TF.ctc_loss(x.log_softmax(2), torch.tensor(targets), torch.tensor(il), torch.tensor(tl), blank,
                           reduction)
    _compare(g, tf, [logits], [0])


def test_ctc_loss_megengine_docstring_example():
    """MegEngine's own example: probabilities, their lengths, concatenated labels."""
    pred = gc.tensor([[[0.0614, 0.9386], [0.8812, 0.1188]], [[0.699, 0.301], [0.2572, 0.7428]]])
    loss = F.nn.ctc_loss(pred, gc.tensor([2, 2]), gc.tensor([1, 1]), gc.tensor([1, 1]))
    np.testing.assert_allclose(loss.numpy(), 0.1504417, rtol=1e-6)


def test_ctc_loss_concatenated_targets_and_zero_infinity():
    logits, targets, il, tl = _ctc_data(1)
    flat = np.concatenate([targets[n, :tl[n]] for n in range(3)])
    lp = F.softmax(gc.tensor(logits), 2)
    a = F.nn.ctc_loss(lp, il, gc.tensor(flat), tl, reduction="none")
    b = F.nn.ctc_loss(lp, il, gc.tensor(targets), tl, reduction="none")
    np.testing.assert_allclose(a.numpy(), b.numpy())
    # an impossible alignment: 4 labels with a repeat in 2 frames
    il2 = np.array([2, 9, 11])
    ref = TF.ctc_loss(torch.tensor(logits).log_softmax(2), torch.tensor(targets), torch.tensor(il2),
                      torch.tensor(tl), reduction="none", zero_infinity=False).numpy()
    got = F.nn.ctc_loss(lp, il2, gc.tensor(targets), tl, reduction="none").numpy()
    # MegEngine's: a large finite loss (paths from log(tiny)); PyTorch's inf; the others equal
    assert np.isinf(ref[0]) and np.isfinite(got[0]) and got[0] > 60         # about -log(float32 tiny) = 87
    np.testing.assert_allclose(got[1:], ref[1:], **TOL)
    # PyTorch's semantics (the op's default floor, -inf), zero_infinity included
    from gradcore.functional.loss import _ctc_of_log_probs
    x = gc.tensor(logits)
    gm = gc.GradManager().attach([x])
    with gm:
        loss = _ctc_of_log_probs(F.log_softmax(x, 2), gc.tensor(targets), il2, tl, 0, "mean", True)
        gm.backward(loss)
    xt = torch.tensor(logits, requires_grad=True)
    lt = TF.ctc_loss(xt.log_softmax(2), torch.tensor(targets), torch.tensor(il2), torch.tensor(tl),
                     zero_infinity=True)
    lt.backward()
    np.testing.assert_allclose(loss.numpy(), lt.detach().numpy(), **TOL)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), **TOL)


def test_ctc_loss_megengines_naive_reference_with_impossible_labels():
    """MegEngine's own test: random labels up to T + 1 long (some impossible),
    against its NumPy reference (the recursion from log(tiny)); values and
    the gradient of the probabilities by finite differences."""
    def reference(pred, pred_lengths, label, label_lengths, blank):
        tiny = np.finfo(np.float32).tiny        # MegEngine computes in float32
        safelog = lambda v: np.log(np.maximum(v, tiny))
        out, start = [], 0
        for n in range(pred.shape[1]):
            lab = label[start:start + label_lengths[n]]
            start += label_lengths[n]
            ext = np.full(2 * len(lab) + 1, blank)
            ext[1::2] = lab
            p = pred[:pred_lengths[n], n]
            a = np.zeros(len(ext), pred.dtype)
            a[:2] = p[0, ext[:2]]
            a = safelog(a)
            mask = ext[2:] != ext[:-2]
            for t in range(1, len(p)):
                b = a.copy()
                b[1:] = np.logaddexp(b[1:], a[:-1])
                b[2:] = np.where(mask, np.logaddexp(b[2:], a[:-2]), b[2:])
                a = b + safelog(p[t, ext])
            out.append(-np.logaddexp(a[-1], a[-2]))
        return np.array(out)
    rng = np.random.default_rng(8)
    for T, C, N in ((1, 2, 1), (6, 5, 4), (9, 3, 6)):
        x = rng.standard_normal((T, N, C))
        pred = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
        il = np.full(N, T, np.int32)
        tl = rng.integers(1, T + 2, N).astype(np.int32)
        label = rng.integers(1, C, tl.sum()).astype(np.int32)
        blank = int(rng.integers(C))            # labels may be the blank symbol, as in MegEngine's test
        got = F.nn.ctc_loss(gc.tensor(pred), gc.tensor(il), gc.tensor(label), gc.tensor(tl), blank, "none")
        np.testing.assert_allclose(got.numpy(), reference(pred, il, label, tl, blank), rtol=1e-10)
        assert gradcheck(lambda p: F.nn.ctc_loss(p, gc.tensor(il), gc.tensor(label), gc.tensor(tl), blank, "sum"),
                         [gc.tensor(pred)], atol=1e-4, rtol=1e-3)


def test_ctc_loss_gradient_wrt_log_probs_is_the_true_one():
    # finite differences on log_probs directly (PyTorch's own gradient here
    # adds exp(log_probs): the logits' gradient through a log_softmax)
    # S=4: the first sample's 4 labels fit (a longer length than S is refused)
    logits, targets, il, tl = _ctc_data(2, T=6, N=2, C=4, S=4)
    targets = np.minimum(targets, 3)
    tl = tl[:2]
    assert gradcheck(lambda lp: F.nn.ctc_loss(F.exp(lp), il, gc.tensor(targets), tl, reduction="sum"),
                     [gc.tensor(logits)])


def test_ctc_ops_pass_check_op(monkeypatch):
    monkeypatch.setenv("GRADCORE_CUDA", "emulator")
    from gradcore.ops import CTCLoss, CTCLossGrad
    rep = check_op(CTCLoss)
    rep.raise_on_failure()
    assert rep.status("grad") == "passed" and rep.status("grad[cuda]") == "passed"
    assert rep.status("gradgrad") == "not applicable"        # declared: max_grad_order = 1
    assert "max_grad_order" in rep["gradgrad"].message
    check_op(CTCLossGrad).raise_on_failure()


def test_ctc_second_order_is_refused_naming_the_op():
    logits, targets, il, tl = _ctc_data()
    x = gc.tensor(logits)
    with pytest.raises(Exception, match="CTCLossGrad"):
        gradgradcheck(lambda x: F.nn.ctc_loss(F.softmax(x, 2), il, gc.tensor(targets), tl), [x])


def test_ctc_loss_errors():
    logits, targets, il, tl = _ctc_data()
    lp = gc.tensor(logits)
    with pytest.raises(ValueError, match=r"ctc_loss: pred must be \(T, N, C\)"):
        F.nn.ctc_loss(lp[0], il, gc.tensor(targets), tl)
    with pytest.raises(ValueError, match="ctc_loss: blank 7"):
        F.nn.ctc_loss(lp, il, gc.tensor(targets), tl, blank=7)
    with pytest.raises(ValueError, match=r"ctc_loss: for pred \(12, 3, 5\)"):
        F.nn.ctc_loss(lp, il, gc.tensor(targets[:2]), tl)
    with pytest.raises(TypeError, match="ctc_loss: label must be an integer tensor"):
        F.nn.ctc_loss(lp, il, gc.tensor(targets.astype("float64")), tl)


def test_ctc_loss_cuda_emulator_matches_cpu():
    from gradcore.cuda import runtime
    logits, targets, il, tl = _ctc_data(3)
    runtime.use("emulator")
    try:
        res = {}
        for dev in ("cpu", "cuda"):
            x = gc.tensor(logits.astype("float32"), device=dev)
            gm = gc.GradManager().attach([x])
            with gm:
                loss = F.nn.ctc_loss(F.softmax(x, 2), gc.tensor(il, device=dev),
                                     gc.tensor(targets, device=dev), gc.tensor(tl, device=dev))
                gm.backward(loss)
            res[dev] = (loss.numpy(), x.grad.numpy())
        np.testing.assert_allclose(res["cuda"][0], res["cpu"][0], rtol=1e-5)
        np.testing.assert_allclose(res["cuda"][1], res["cpu"][1], rtol=1e-4, atol=1e-6)
    finally:
        runtime.use(None)
