"""End-to-end programs run the same way in gradcore (MegEngine-style API) and
in PyTorch, comparing losses, outputs, gradients and trained parameters.

Conventions mapped between the two:
- BatchNorm momentum m in gradcore is PyTorch's 1 - m;
- a grouped Conv2d weight is MegEngine's 5-D (G, O/G, I/G, kh, kw);
- Linear weights are (out, in) in both;
- F.softmax's default axis is MegEngine's, so the axis is always given.
Float64 wherever the program allows it (functional models on float64
Parameters); module-based programs are float32 with float32 tolerances.
"""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.autodiff import Function, GradManager

F64 = dict(rtol=1e-9, atol=1e-11)
F32 = dict(rtol=2e-4, atol=2e-5)


def close(a, b, **tol):
    a = a.numpy() if isinstance(a, gc.Tensor) else np.asarray(a)
    if hasattr(b, "detach"):
        b = b.detach().numpy()
    b = np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, **(tol or F64))


def tt(torch, a, grad=True):
    return torch.tensor(np.array(a), requires_grad=grad)


# --------------------------------------------------------------------------
# 1. MLP classifier trained with SGD (momentum + weight decay) and Adam
# --------------------------------------------------------------------------
def _mlp_data(rng):
    x = rng.normal(size=(32, 6))
    y = rng.integers(0, 4, 32)
    ws = [rng.normal(scale=0.5, size=(16, 6)), rng.normal(scale=0.1, size=16),
          rng.normal(scale=0.5, size=(12, 16)), rng.normal(scale=0.1, size=12),
          rng.normal(scale=0.5, size=(4, 12)), rng.normal(scale=0.1, size=4)]
    return x, y, ws


def _mlp_gc(params, x):
    w1, b1, w2, b2, w3, b3 = params
    h = F.relu(F.linear(x, w1, b1))
    h = F.tanh(F.linear(h, w2, b2))
    return F.linear(h, w3, b3)


def _mlp_torch(torch, params, x):
    w1, b1, w2, b2, w3, b3 = params
    h = torch.relu(torch.nn.functional.linear(x, w1, b1))
    h = torch.tanh(torch.nn.functional.linear(h, w2, b2))
    return torch.nn.functional.linear(h, w3, b3)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_mlp_classifier_training_curve(torch, rng, kind):
    x_np, y_np, ws = _mlp_data(rng)
    params = [gc.Parameter(w.copy()) for w in ws]
    tparams = [tt(torch, w) for w in ws]
    if kind == "sgd":
        opt = optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
        topt = torch.optim.SGD(tparams, lr=0.1, momentum=0.9, weight_decay=1e-3)
    else:
        opt = optim.Adam(params, lr=0.01, betas=(0.8, 0.99), weight_decay=1e-3)
        topt = torch.optim.Adam(tparams, lr=0.01, betas=(0.8, 0.99), weight_decay=1e-3)
    gm = GradManager().attach(params)
    x, y = gc.tensor(x_np), gc.tensor(y_np.astype("int32"))
    xt, yt = torch.tensor(x_np), torch.tensor(y_np)
    losses, tlosses = [], []
    for _ in range(20):
        with gm:
            loss = F.cross_entropy(_mlp_gc(params, x), y)
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(loss.item())
        tloss = torch.nn.functional.cross_entropy(_mlp_torch(torch, tparams, xt), yt)
        topt.zero_grad()
        tloss.backward()
        topt.step()
        tlosses.append(tloss.item())
    np.testing.assert_allclose(losses, tlosses, rtol=1e-8)
    assert losses[-1] < losses[0]
    for p, tp in zip(params, tparams):
        close(p, tp, rtol=1e-7, atol=1e-9)
        assert p.grad is None


def test_mlp_modules_float32_sgd_nesterov(torch, rng):
    tnet = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                               torch.nn.GELU(), torch.nn.Linear(8, 3))
    net = M.Sequential(M.Linear(5, 8), M.ReLU(), M.Linear(8, 8), M.GELU(), M.Linear(8, 3))
    net.load_state_dict({k: v.detach().numpy() for k, v in tnet.state_dict().items()})
    opt = optim.SGD(net.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2)
    topt = torch.optim.SGD(tnet.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2)
    gm = GradManager().attach(net.parameters())
    x_np = rng.normal(size=(16, 5)).astype("float32")
    y_np = rng.integers(0, 3, 16)
    for step in range(10):
        with gm:
            loss = F.cross_entropy(net(gc.tensor(x_np)), gc.tensor(y_np), label_smooth=0.1)
            gm.backward(loss)
        opt.step().clear_grad()
        tloss = torch.nn.functional.cross_entropy(tnet(torch.tensor(x_np)), torch.tensor(y_np),
                                                  label_smoothing=0.1)
        topt.zero_grad()
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
    tparams = dict(tnet.named_parameters())
    assert [n for n, _ in net.named_parameters()] == sorted(tparams)     # MegEngine's sorted order
    for n, p in net.named_parameters():
        close(p, tparams[n], rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# 2. a small CNN: conv, batch norm (train, then eval), max/avg pool, dropout
# --------------------------------------------------------------------------
def load_from_torch(net, tnet):
    """Copy a torch module's parameters and buffers into a gradcore module
    with the same names, reshaping to gradcore's layouts (5-D grouped conv
    weights, (1, C, 1, 1) conv biases and batch-norm parameters)."""
    tstate = {k: v.detach().numpy() for k, v in tnet.state_dict().items()}
    net.load_state_dict(lambda k, t: tstate[k].reshape(t.shape))


class _GcCNN(M.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = M.Conv2d(3, 8, 3, padding=1)
        self.bn1 = M.BatchNorm2d(8, momentum=0.8)
        self.pool1 = M.MaxPool2d(2)
        self.conv2 = M.Conv2d(8, 8, 3, padding=1, groups=2)
        self.bn2 = M.BatchNorm2d(8, momentum=0.8)
        self.pool2 = M.AvgPool2d(2)
        self.drop = M.Dropout(0.0)
        self.fc = M.Linear(32, 5)

    def forward(self, x):
        x = self.pool1(F.relu(self.bn1(self.conv1(x))))
        x = self.pool2(F.relu(self.bn2(self.conv2(x))))
        return self.fc(F.flatten(self.drop(x), 1))


def _torch_cnn(torch):
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(8, momentum=0.2)
            self.pool1 = nn.MaxPool2d(2)
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
            self.bn2 = nn.BatchNorm2d(8, momentum=0.2)
            self.pool2 = nn.AvgPool2d(2)
            self.drop = nn.Dropout(0.0)
            self.fc = nn.Linear(32, 5)

        def forward(self, x):
            x = self.pool1(torch.relu(self.bn1(self.conv1(x))))
            x = self.pool2(torch.relu(self.bn2(self.conv2(x))))
            return self.fc(torch.flatten(self.drop(x), 1))
    return Net()


def test_small_cnn_train_then_eval(torch, rng):
    torch.manual_seed(0)
    tnet = _torch_cnn(torch)
    net = _GcCNN()
    load_from_torch(net, tnet)
    assert net.conv2.weight.shape == (2, 4, 4, 3, 3)
    opt = optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    topt = torch.optim.SGD(tnet.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    gm = GradManager().attach(net.parameters())
    for step in range(4):
        x_np = rng.normal(size=(6, 3, 8, 8)).astype("float32")
        y_np = rng.integers(0, 5, 6)
        with gm:
            loss = F.cross_entropy(net(gc.tensor(x_np)), gc.tensor(y_np), label_smooth=0.2)
            gm.backward(loss)
        grads = {n: p.grad.numpy().copy() for n, p in net.named_parameters()}
        opt.step().clear_grad()
        tloss = torch.nn.functional.cross_entropy(tnet(torch.tensor(x_np)), torch.tensor(y_np),
                                                  label_smoothing=0.2)
        topt.zero_grad()
        tloss.backward()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
        for n, tp in tnet.named_parameters():
            g = tp.grad.numpy()
            close(grads[n].reshape(g.shape), g, rtol=1e-3, atol=2e-5)
        topt.step()
    tstate = tnet.state_dict()
    for k, v in net.state_dict().items():
        close(np.asarray(v).reshape(tstate[k].shape), tstate[k], rtol=1e-3, atol=1e-5)
    net.eval()
    tnet.eval()
    x_np = rng.normal(size=(3, 3, 8, 8)).astype("float32")
    x = gc.tensor(x_np)
    xt = tt(torch, x_np)
    gm2 = GradManager().attach([x])
    with gm2:
        out = net(x)
        gm2.backward(F.logsumexp(out, axis=1).sum())
    tout = tnet(xt)
    torch.logsumexp(tout, 1).sum().backward()
    close(out, tout, rtol=1e-4, atol=1e-5)
    close(x.grad, xt.grad, rtol=1e-3, atol=1e-5)


def test_functional_cnn_float64_strides_padding_dilation(torch, rng):
    tf = torch.nn.functional
    x_np = rng.normal(size=(4, 4, 9, 9))
    w1 = rng.normal(size=(6, 2, 3, 3)) * 0.3     # groups=2
    b1 = rng.normal(size=6)
    w2 = rng.normal(size=(5, 6, 2, 2)) * 0.3
    g_np, be_np = rng.normal(size=6), rng.normal(size=6)
    rm_np, rv_np = rng.normal(size=6), rng.uniform(0.5, 2, size=6)

    x = gc.tensor(x_np)
    W1 = gc.Parameter(w1.reshape(2, 3, 2, 3, 3))
    B1, W2 = gc.Parameter(b1.reshape(1, 6, 1, 1)), gc.Parameter(w2)
    G, BE = gc.Parameter(g_np), gc.Parameter(be_np)
    rm, rv = gc.tensor(rm_np.reshape(1, 6, 1, 1)), gc.tensor(rv_np.reshape(1, 6, 1, 1))
    gm = GradManager().attach([x, W1, B1, W2, G, BE])
    with gm:
        h = F.conv2d(x, W1, B1, stride=1, padding=2, dilation=2, groups=2)
        h = F.batch_norm(h, rm, rv, G, BE, training=True, momentum=0.7, eps=1e-3)
        h = F.max_pool2d(h, 3, stride=2, padding=1)
        h = F.leaky_relu(h, 0.1)
        h = F.conv2d(h, W2, stride=2, padding=1)
        h2 = F.avg_pool2d(h, 2, 1, 1, mode="average")
        h = F.avg_pool2d(h, 2, stride=1, padding=1)
        loss = (h * h).mean() + h2.sum()
        gm.backward(loss)

    xt = tt(torch, x_np)
    W1t, B1t, W2t, Gt, BEt = (tt(torch, a) for a in (w1, b1, w2, g_np, be_np))
    rmt, rvt = torch.tensor(rm_np), torch.tensor(rv_np)
    h = tf.conv2d(xt, W1t, B1t, stride=1, padding=2, dilation=2, groups=2)
    h = tf.batch_norm(h, rmt, rvt, Gt, BEt, training=True, momentum=0.3, eps=1e-3)
    h = tf.max_pool2d(h, 3, stride=2, padding=1)
    h = tf.leaky_relu(h, 0.1)
    h = tf.conv2d(h, W2t, stride=2, padding=1)
    h2 = tf.avg_pool2d(h, 2, stride=1, padding=1, count_include_pad=True)
    h = tf.avg_pool2d(h, 2, stride=1, padding=1, count_include_pad=False)
    tloss = (h * h).mean() + h2.sum()
    tloss.backward()
    close(loss, tloss)
    close(x.grad, xt.grad)
    close(W1.grad, W1t.grad.reshape(2, 3, 2, 3, 3))
    close(B1.grad, B1t.grad.reshape(1, 6, 1, 1))
    close(W2.grad, W2t.grad)
    close(G.grad, Gt.grad)
    close(BE.grad, BEt.grad)
    close(rm.numpy().ravel(), rmt)
    close(rv.numpy().ravel(), rvt)


# --------------------------------------------------------------------------
# 3. a self-attention block: batched matmul, softmax, layer norm, gelu
# --------------------------------------------------------------------------
def _attention_params(rng, d=8, hidden=16):
    return dict(wq=rng.normal(size=(d, d)) / 3, wk=rng.normal(size=(d, d)) / 3,
                wv=rng.normal(size=(d, d)) / 3, wo=rng.normal(size=(d, d)) / 3,
                g1=1 + 0.1 * rng.normal(size=d), b1=0.1 * rng.normal(size=d),
                w1=rng.normal(size=(hidden, d)) / 3, c1=0.1 * rng.normal(size=hidden),
                w2=rng.normal(size=(d, hidden)) / 4, c2=0.1 * rng.normal(size=d),
                g2=1 + 0.1 * rng.normal(size=d), b2=0.1 * rng.normal(size=d))


def _attention_gc(x, p, heads=2, mask=None):
    n, l, d = x.shape
    hd = d // heads
    h = F.nn.layer_norm(x, d, True, p["g1"], p["b1"])

    def split(t):
        return F.transpose(F.reshape(t, (n, l, heads, hd)), (0, 2, 1, 3))
    q, k, v = split(F.matmul(h, p["wq"])), split(F.matmul(h, p["wk"])), split(F.matmul(h, p["wv"]))
    s = F.matmul(q, k, transpose_b=True) / np.sqrt(hd)
    if mask is not None:
        s = F.where(mask, s, gc.tensor(np.full(s.shape, -1e9)))
    a = F.softmax(s, axis=-1)
    o = F.reshape(F.transpose(F.matmul(a, v), (0, 2, 1, 3)), (n, l, d))
    x = x + F.matmul(o, p["wo"])
    h = F.nn.layer_norm(x, d, True, p["g2"], p["b2"])
    h = F.linear(F.gelu(F.linear(h, p["w1"], p["c1"])), p["w2"], p["c2"])
    return x + h


def _attention_torch(torch, x, p, heads=2, mask=None):
    tf = torch.nn.functional
    n, l, d = x.shape
    hd = d // heads
    h = tf.layer_norm(x, (d,), p["g1"], p["b1"])

    def split(t):
        return t.reshape(n, l, heads, hd).permute(0, 2, 1, 3)
    q, k, v = split(h @ p["wq"]), split(h @ p["wk"]), split(h @ p["wv"])
    s = q @ k.transpose(-1, -2) / np.sqrt(hd)
    if mask is not None:
        s = torch.where(mask, s, torch.full(s.shape, -1e9, dtype=s.dtype))
    a = torch.softmax(s, -1)
    o = (a @ v).permute(0, 2, 1, 3).reshape(n, l, d)
    x = x + o @ p["wo"]
    h = tf.layer_norm(x, (d,), p["g2"], p["b2"])
    h = tf.linear(tf.gelu(tf.linear(h, p["w1"], p["c1"])), p["w2"], p["c2"])
    return x + h


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_block_forward_backward(torch, rng, causal):
    x_np = rng.normal(size=(3, 5, 8))
    pn = _attention_params(rng)
    mask_np = np.tril(np.ones((5, 5), bool))[None, None].repeat(3, 0).repeat(2, 1) if causal else None
    x = gc.tensor(x_np)
    p = {k: gc.Parameter(v) for k, v in pn.items()}
    gm = GradManager().attach([x] + list(p.values()))
    with gm:
        y = _attention_gc(x, p, mask=None if mask_np is None else gc.tensor(mask_np))
        loss = (y * gc.tensor(np.linspace(-1, 1, 8))).sum() + (y ** 2).mean()
        gm.backward(loss)
    xt = tt(torch, x_np)
    pt = {k: tt(torch, v) for k, v in pn.items()}
    yt = _attention_torch(torch, xt, pt, mask=None if mask_np is None else torch.tensor(mask_np))
    tloss = (yt * torch.tensor(np.linspace(-1, 1, 8))).sum() + (yt ** 2).mean()
    tloss.backward()
    close(y, yt, rtol=1e-9, atol=1e-10)
    close(x.grad, xt.grad, rtol=1e-8, atol=1e-10)
    for k in pn:
        close(p[k].grad, pt[k].grad, rtol=1e-8, atol=1e-10)


# --------------------------------------------------------------------------
# 4. an RNN unrolled over time: weight sharing, accumulation across steps
# --------------------------------------------------------------------------
def test_tanh_rnn_unrolled_bptt(torch, rng):
    n, steps, din, dh = 4, 10, 3, 6
    xs_np = rng.normal(size=(n, steps, din))
    targets_np = rng.normal(size=(n, steps))
    wx_np, wh_np = rng.normal(size=(din, dh)) * 0.5, rng.normal(size=(dh, dh)) * 0.4
    b_np, wo_np, h0_np = rng.normal(size=dh) * 0.1, rng.normal(size=(dh, 1)), rng.normal(size=(n, dh))

    wx, wh, b, wo = (gc.Parameter(a) for a in (wx_np, wh_np, b_np, wo_np))
    h0 = gc.tensor(h0_np)
    xs, targets = gc.tensor(xs_np), gc.tensor(targets_np)
    gm = GradManager().attach([wx, wh, b, wo, h0])
    with gm:
        h = h0
        loss = 0.0
        outs = []
        for t in range(steps):
            h = F.tanh(F.matmul(xs[:, t], wx) + F.matmul(h, wh) + b)
            o = F.squeeze(F.matmul(h, wo), 1)
            outs.append(o)
            loss = loss + ((o - targets[:, t]) ** 2).mean()
        seq = F.stack(outs, axis=1)
        loss = loss + 0.1 * F.logsumexp(seq, axis=1).mean()
        gm.backward(loss)

    wxt, wht, bt, wot, h0t = (tt(torch, a) for a in (wx_np, wh_np, b_np, wo_np, h0_np))
    xst, targetst = torch.tensor(xs_np), torch.tensor(targets_np)
    h = h0t
    tloss = 0.0
    outs = []
    for t in range(steps):
        h = torch.tanh(xst[:, t] @ wxt + h @ wht + bt)
        o = (h @ wot).squeeze(1)
        outs.append(o)
        tloss = tloss + ((o - targetst[:, t]) ** 2).mean()
    tloss = tloss + 0.1 * torch.logsumexp(torch.stack(outs, 1), 1).mean()
    tloss.backward()
    close(loss, tloss)
    for a, at in ((wx, wxt), (wh, wht), (b, bt), (wo, wot), (h0, h0t)):
        close(a.grad, at.grad)


def test_rnn_truncated_bptt_and_gradient_accumulation_over_microbatches(torch, rng):
    """Two chunks of 5 steps each (the state detached between them, as in
    truncated BPTT), each chunk's backward accumulating into .grad, one
    Adam step after both; three such rounds."""
    n, din, dh = 3, 2, 5
    w_np = rng.normal(size=(din + dh, dh)) * 0.5
    b_np = rng.normal(size=dh) * 0.1
    w, b = gc.Parameter(w_np), gc.Parameter(b_np)
    wt, bt = tt(torch, w_np), tt(torch, b_np)
    opt = optim.Adam([w, b], lr=0.05)
    topt = torch.optim.Adam([wt, bt], lr=0.05)
    gm = GradManager().attach([w, b])
    for _ in range(3):
        xs_np = rng.normal(size=(2, 5, n, din))
        h = gc.tensor(np.zeros((n, dh)))
        ht = torch.zeros(n, dh, dtype=torch.float64)
        for chunk in range(2):
            with gm:
                loss = 0.0
                for t in range(5):
                    h = F.tanh(F.matmul(F.concat([gc.tensor(xs_np[chunk, t]), h], axis=1), w) + b)
                    loss += (h.sum(axis=1) ** 2).mean()       # in-place add, recorded
                gm.backward(loss)
            h = h.detach()
            tloss = 0.0
            for t in range(5):
                ht = torch.tanh(torch.cat([torch.tensor(xs_np[chunk, t]), ht], 1) @ wt + bt)
                tloss += (ht.sum(1) ** 2).mean()
            tloss.backward()
            ht = ht.detach()
            close(loss, tloss)
        close(w.grad, wt.grad)
        close(b.grad, bt.grad)
        opt.step().clear_grad()
        topt.step()
        topt.zero_grad()
    close(w, wt, rtol=1e-8, atol=1e-10)
    close(b, bt, rtol=1e-8, atol=1e-10)


# --------------------------------------------------------------------------
# 5. higher order: gradient penalty, Hessian-vector products, 3rd derivative
# --------------------------------------------------------------------------
def test_gradient_penalty_backprop_into_weights(torch, rng):
    """WGAN-GP style: loss + lam * (||d out / d x||_2 - 1)^2 per sample,
    differentiated with respect to the critic's weights."""
    x_np = rng.normal(size=(5, 4))
    w1_np, b1_np = rng.normal(size=(4, 7)) * 0.6, rng.normal(size=7) * 0.1
    w2_np = rng.normal(size=(7, 1)) * 0.6

    w1, b1, w2 = (gc.Parameter(a) for a in (w1_np, b1_np, w2_np))
    x = gc.tensor(x_np)
    outer = GradManager().attach([w1, b1, w2])
    inner = GradManager().attach([x])
    with outer:
        with inner:
            out = F.matmul(F.nn.softplus(F.matmul(x, w1) + b1) * F.tanh(F.matmul(x, w1)), w2)
            inner.backward(out.sum())
        gx = x.grad
        gnorm = F.sqrt((gx ** 2).sum(axis=1) + 1e-12)
        loss = out.mean() + 10.0 * ((gnorm - 1) ** 2).mean()
        outer.backward(loss)

    w1t, b1t, w2t = (tt(torch, a) for a in (w1_np, b1_np, w2_np))
    xt = tt(torch, x_np)
    out_t = (torch.nn.functional.softplus(xt @ w1t + b1t) * torch.tanh(xt @ w1t)) @ w2t
    (gxt,) = torch.autograd.grad(out_t.sum(), xt, create_graph=True)
    gnorm_t = torch.sqrt((gxt ** 2).sum(1) + 1e-12)
    tloss = out_t.mean() + 10.0 * ((gnorm_t - 1) ** 2).mean()
    tloss.backward()
    close(gx, gxt)
    close(loss, tloss)
    close(w1.grad, w1t.grad)
    close(b1.grad, b1t.grad)
    close(w2.grad, w2t.grad)


def test_hessian_vector_products_of_a_network_loss(torch, rng):
    x_np, y_np = rng.normal(size=(6, 3)), rng.integers(0, 3, 6)
    w1_np, w2_np = rng.normal(size=(3, 5)), rng.normal(size=(5, 3))
    v1_np, v2_np = rng.normal(size=(3, 5)), rng.normal(size=(5, 3))

    def net_gc(w1, w2, x):
        return F.cross_entropy(F.matmul(F.sigmoid(F.matmul(x, w1)), w2), gc.tensor(y_np))

    w1, w2 = gc.Parameter(w1_np), gc.Parameter(w2_np)
    outer, inner = GradManager().attach([w1, w2]), GradManager().attach([w1, w2])
    with outer:
        with inner:
            loss = net_gc(w1, w2, gc.tensor(x_np))
            inner.backward(loss)
        g1, g2 = w1.grad, w2.grad
        w1.grad = w2.grad = None
        outer.backward((g1 * gc.tensor(v1_np)).sum() + (g2 * gc.tensor(v2_np)).sum())
    hv1, hv2 = w1.grad, w2.grad

    w1t, w2t = tt(torch, w1_np), tt(torch, w2_np)
    tloss = torch.nn.functional.cross_entropy(torch.sigmoid(torch.tensor(x_np) @ w1t) @ w2t,
                                              torch.tensor(y_np))
    g1t, g2t = torch.autograd.grad(tloss, (w1t, w2t), create_graph=True)
    hv1t, hv2t = torch.autograd.grad((g1t * torch.tensor(v1_np)).sum() + (g2t * torch.tensor(v2_np)).sum(),
                                     (w1t, w2t))
    close(loss, tloss)
    close(g1, g1t)
    close(g2, g2t)
    close(hv1, hv1t)
    close(hv2, hv2t)


def test_third_derivative_of_a_scalar_function(torch):
    x_np = np.array([0.3, -1.2, 2.0, 0.7])

    def f(x, lib):
        if lib is F:
            return F.sin(x) * x ** 3 + F.exp(-x * x) + F.log(1 + x * x) * F.sigmoid(x)
        return torch.sin(x) * x ** 3 + torch.exp(-x * x) + torch.log(1 + x * x) * torch.sigmoid(x)

    x = gc.tensor(x_np)
    g3, g2, g1 = (GradManager().attach(x) for _ in range(3))
    with g3:
        with g2:
            with g1:
                y = f(x, F)
                g1.backward(y.sum())
            d1, x.grad = x.grad, None
            g2.backward(d1.sum())
        d2, x.grad = x.grad, None
        g3.backward(d2.sum())
    d3 = x.grad

    xt = tt(torch, x_np)
    yt = f(xt, torch)
    (d1t,) = torch.autograd.grad(yt.sum(), xt, create_graph=True)
    (d2t,) = torch.autograd.grad(d1t.sum(), xt, create_graph=True)
    (d3t,) = torch.autograd.grad(d2t.sum(), xt)
    close(y, yt)
    close(d1, d1t)
    close(d2, d2t)
    close(d3, d3t)


def test_double_backward_through_softmax_layer_norm_and_gelu(torch, rng):
    """A Hessian-vector product of a loss through the attention block's
    layers: softmax, layer norm, gelu, batched matmul."""
    x_np = rng.normal(size=(2, 4, 8))
    pn = _attention_params(rng)
    v_np = rng.normal(size=(2, 4, 8))
    x = gc.tensor(x_np)
    p = {k: gc.Parameter(a) for k, a in pn.items()}
    outer = GradManager().attach([p["wq"], p["g1"], p["w1"]])
    inner = GradManager().attach([x])
    with outer:
        with inner:
            y = _attention_gc(x, p)
            inner.backward((y ** 2).sum())
        gx = x.grad
        outer.backward((gx * gc.tensor(v_np)).sum())

    xt = tt(torch, x_np)
    pt = {k: tt(torch, a) for k, a in pn.items()}
    yt = _attention_torch(torch, xt, pt)
    (gxt,) = torch.autograd.grad((yt ** 2).sum(), xt, create_graph=True)
    mixed = torch.autograd.grad((gxt * torch.tensor(v_np)).sum(), (pt["wq"], pt["g1"], pt["w1"]))
    close(gx, gxt, rtol=1e-8, atol=1e-10)
    for k, m in zip(("wq", "g1", "w1"), mixed):
        close(p[k].grad, m, rtol=1e-7, atol=1e-9)


# --------------------------------------------------------------------------
# 6. custom Functions inside a model, first and second order
# --------------------------------------------------------------------------
class STEClamp(Function):
    """Clamp to [-1, 1] in the forward; the straight-through estimator in the backward."""

    def forward(self, x):
        return F.clip(x, -1.0, 1.0)

    def backward(self, dy):
        return dy


class MySigmoid(Function):
    def forward(self, x):
        y = 1 / (1 + F.exp(-x))
        self.save_for_backward(y)
        return y

    def backward(self, dy):
        (y,) = self.saved_tensors
        return dy * y * (1 - y)


def _torch_functions(torch):
    class TSTEClamp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clamp(-1.0, 1.0)

        @staticmethod
        def backward(ctx, dy):
            return dy

    class TSigmoid(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = 1 / (1 + torch.exp(-x))
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, dy):
            (y,) = ctx.saved_tensors
            return dy * y * (1 - y)
    return TSTEClamp.apply, TSigmoid.apply


def test_custom_functions_in_a_quantised_style_model(torch, rng):
    x_np, y_np = rng.normal(size=(8, 4)) * 2, rng.integers(0, 3, 8)
    w1_np, w2_np = rng.normal(size=(6, 4)), rng.normal(size=(3, 6))
    w1, w2 = gc.Parameter(w1_np), gc.Parameter(w2_np)
    w1t, w2t = tt(torch, w1_np), tt(torch, w2_np)
    tclamp, tsig = _torch_functions(torch)
    opt = optim.SGD([w1, w2], lr=0.5, momentum=0.5)
    topt = torch.optim.SGD([w1t, w2t], lr=0.5, momentum=0.5)
    gm = GradManager().attach([w1, w2])
    for _ in range(5):
        with gm:
            h = MySigmoid()(F.linear(STEClamp()(gc.tensor(x_np)), STEClamp()(w1)))
            loss = F.cross_entropy(F.linear(h, w2), gc.tensor(y_np))
            gm.backward(loss)
        opt.step().clear_grad()
        ht = tsig(torch.nn.functional.linear(tclamp(torch.tensor(x_np)), tclamp(w1t)))
        tloss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(ht, w2t), torch.tensor(y_np))
        topt.zero_grad()
        tloss.backward()
        topt.step()
        close(loss, tloss)
    close(w1, w1t)
    close(w2, w2t)


def test_custom_sigmoid_second_order_through_saved_output(torch, rng):
    x_np = rng.normal(size=(5,))
    w_np = rng.normal(size=(5,))
    x, w = gc.tensor(x_np), gc.Parameter(w_np)
    outer, inner = GradManager().attach([w]), GradManager().attach([x])
    with outer:
        with inner:
            y = MySigmoid()(x * w)
            inner.backward((y * y).sum())
        gx = x.grad
        outer.backward((gx * gx).sum())

    _, tsig = _torch_functions(torch)
    xt, wt = tt(torch, x_np), tt(torch, w_np)
    yt = tsig(xt * wt)
    (gxt,) = torch.autograd.grad((yt * yt).sum(), xt, create_graph=True)
    (gxt * gxt).sum().backward()
    close(y, yt)
    close(gx, gxt)
    close(w.grad, wt.grad)

    # the Hessian diagonal of the custom sigmoid itself: d2/dx2 sigmoid
    x = gc.tensor(x_np)
    outer, inner = GradManager().attach([x]), GradManager().attach([x])
    with outer:
        with inner:
            inner.backward(MySigmoid()(x).sum())
        d1, x.grad = x.grad, None
        outer.backward(d1.sum())
    xt = tt(torch, x_np)
    (d1t,) = torch.autograd.grad(tsig(xt).sum(), xt, create_graph=True)
    (d2t,) = torch.autograd.grad(d1t.sum(), xt)
    close(d1, d1t)
    close(x.grad, d2t)


# --------------------------------------------------------------------------
# 7. indexing-heavy programs
# --------------------------------------------------------------------------
def test_embedding_bag_model_with_repeated_indices(torch, rng):
    """Token ids with repeats (within and across rows) -> embedding -> masked
    mean over valid positions -> linear -> cross entropy; trained 5 steps."""
    vocab, dim = 7, 4
    ids_np = np.array([[1, 1, 3, 0, 0], [2, 6, 6, 6, 1], [5, 1, 0, 0, 0]])
    lens = np.array([3, 5, 2])
    valid_np = np.arange(5)[None] < lens[:, None]
    y_np = np.array([0, 2, 1])
    e_np, w_np = rng.normal(size=(vocab, dim)), rng.normal(size=(3, dim))
    emb, w = gc.Parameter(e_np), gc.Parameter(w_np)
    embt, wt = tt(torch, e_np), tt(torch, w_np)
    opt, topt = optim.Adam([emb, w], lr=0.1), torch.optim.Adam([embt, wt], lr=0.1)
    gm = GradManager().attach([emb, w])
    ids = gc.tensor(ids_np.astype("int32"))
    valid = gc.tensor(valid_np.astype("float64"))
    for _ in range(5):
        with gm:
            vecs = F.embedding(ids, emb)                       # (3, 5, dim)
            pooled = (vecs * F.expand_dims(valid, 2)).sum(axis=1) / F.expand_dims(valid.sum(axis=1), 1)
            loss = F.cross_entropy(F.linear(pooled, w), gc.tensor(y_np))
            gm.backward(loss)
        gemb = emb.grad.numpy().copy()
        opt.step().clear_grad()
        vecs = torch.nn.functional.embedding(torch.tensor(ids_np), embt)
        vt = torch.tensor(valid_np.astype("float64"))
        pooled = (vecs * vt[:, :, None]).sum(1) / vt.sum(1, keepdim=True)
        tloss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(pooled, wt), torch.tensor(y_np))
        topt.zero_grad()
        tloss.backward()
        close(loss, tloss)
        close(gemb, embt.grad)
        topt.step()
    close(emb, embt, rtol=1e-8, atol=1e-10)
    close(w, wt, rtol=1e-8, atol=1e-10)
    # an unused row never moves (Adam with zero gradients)
    close(emb.numpy()[4], e_np[4])


def test_gather_scatter_gradients(torch, rng):
    x_np = rng.normal(size=(4, 6))
    src_np = rng.normal(size=(4, 3))
    gidx_np = rng.integers(0, 6, size=(4, 5))
    sidx_np = np.stack([rng.permutation(6)[:3] for _ in range(4)])
    g0idx_np = rng.integers(0, 4, size=(2, 6))
    lab_np = rng.integers(0, 6, 4)

    x, src = gc.tensor(x_np), gc.tensor(src_np)
    gm = GradManager().attach([x, src])
    with gm:
        g = F.gather(x, 1, gc.tensor(gidx_np.astype("int32")))
        s = F.scatter(x * 2, 1, gc.tensor(sidx_np.astype("int32")), src * src)
        picked = F.indexing_one_hot(F.log_softmax(s, axis=1), gc.tensor(lab_np), 1)
        g0 = F.gather(s, 0, gc.tensor(g0idx_np.astype("int32")))
        loss = (g * g).sum() - picked.sum() + F.sin(g0).sum()
        gm.backward(loss)

    xt, srct = tt(torch, x_np), tt(torch, src_np)
    gt = torch.gather(xt, 1, torch.tensor(gidx_np))
    st = torch.scatter(xt * 2, 1, torch.tensor(sidx_np), srct * srct)
    pickedt = torch.log_softmax(st, 1).gather(1, torch.tensor(lab_np)[:, None])[:, 0]
    g0t = torch.gather(st, 0, torch.tensor(g0idx_np))
    tloss = (gt * gt).sum() - pickedt.sum() + torch.sin(g0t).sum()
    tloss.backward()
    close(loss, tloss)
    close(x.grad, xt.grad)
    close(src.grad, srct.grad)


def test_boolean_masked_losses(torch, rng):
    """Only the positions a mask selects contribute: x[mask] (a boolean
    advanced index), where-based masking, and a masked mean."""
    pred_np = rng.normal(size=(5, 6))
    target_np = rng.normal(size=(5, 6))
    mask_np = rng.random((5, 6)) < 0.4
    w_np = rng.normal(size=(6, 6)) * 0.5
    w = gc.Parameter(w_np)
    pred, target, mask = gc.tensor(pred_np), gc.tensor(target_np), gc.tensor(mask_np)
    gm = GradManager().attach([w])
    with gm:
        out = F.matmul(pred, w)
        l1 = ((out[mask] - target[mask]) ** 2).mean()
        l2 = F.where(mask, F.abs(out - target), F.zeros_like(out)).sum() / mask.astype("float64").sum()
        rows = out[mask_np.any(axis=1)]                        # a NumPy boolean row mask
        l3 = F.logsumexp(rows, axis=1).sum()
        loss = l1 + l2 + 0.1 * l3
        gm.backward(loss)

    wt = tt(torch, w_np)
    predt, targett, maskt = torch.tensor(pred_np), torch.tensor(target_np), torch.tensor(mask_np)
    out = predt @ wt
    l1 = ((out[maskt] - targett[maskt]) ** 2).mean()
    l2 = torch.where(maskt, (out - targett).abs(), torch.zeros_like(out)).sum() / maskt.double().sum()
    l3 = torch.logsumexp(out[maskt.any(1)], 1).sum()
    tloss = l1 + l2 + 0.1 * l3
    tloss.backward()
    close(loss, tloss)
    close(w.grad, wt.grad)


def test_setitem_in_the_forward(torch, rng):
    """Index assignment inside the recorded forward: slices, integer arrays,
    a boolean mask and a scalar; gradients to the tensor written into and to
    the values written."""
    x_np = rng.normal(size=(4, 5))
    v_np = rng.normal(size=(4, 2))
    r_np = rng.normal(size=(5,))
    mask_np = rng.random((4, 5)) < 0.3
    x, v, r = gc.tensor(x_np), gc.tensor(v_np), gc.tensor(r_np)
    gm = GradManager().attach([x, v, r])
    with gm:
        y = x * 3
        y[:, 1:3] = v * v                      # overwrite a slice
        y[np.array([0, 2])] = F.exp(r)         # rows by integer array (broadcast value)
        y[gc.tensor(mask_np)] = 0.5            # a boolean mask, a scalar
        y[-1, ::2] = y[-1, ::2] * 2            # read and write the same strided region
        z = F.tanh(y).sum(axis=0) * r
        loss = (z ** 2).sum()
        gm.backward(loss)

    xt, vt, rt = tt(torch, x_np), tt(torch, v_np), tt(torch, r_np)
    y = xt * 3
    y[:, 1:3] = vt * vt
    y[torch.tensor([0, 2])] = torch.exp(rt)
    y[torch.tensor(mask_np)] = 0.5
    y[-1, ::2] = y[-1, ::2].clone() * 2
    z = torch.tanh(y).sum(0) * rt
    tloss = (z ** 2).sum()
    tloss.backward()
    close(loss, tloss)
    close(x.grad, xt.grad)
    close(v.grad, vt.grad)
    close(r.grad, rt.grad)


def test_advanced_indexing_with_repeats_and_mixed_indices(torch, rng):
    x_np = rng.normal(size=(5, 4, 3))
    x = gc.tensor(x_np)
    i, j = np.array([0, 4, 0, 2, 0]), np.array([1, 1, 3, 1, 1])
    gm = GradManager().attach([x])
    with gm:
        a = x[i, j]                     # (5, 3): pairs with repeats
        b = x[[1, 1, 3], :, 2]          # (3, 4)
        c = x[..., None][2:, -1, ::-1]  # (3, 3, 1) reversed
        d = x[:, [3, 3, 0]][1:4:2]      # (2, 3, 3)
        loss = (a ** 3).sum() + F.exp(b).sum() + (c * c).sum() + F.sin(d).sum()
        gm.backward(loss)
    xt = tt(torch, x_np)
    a = xt[i, j]
    b = xt[[1, 1, 3], :, 2]
    c = xt[..., None][2:, -1].flip(1)
    d = xt[:, [3, 3, 0]][1:4:2]
    tloss = (a ** 3).sum() + torch.exp(b).sum() + (c * c).sum() + torch.sin(d).sum()
    tloss.backward()
    close(loss, tloss)
    close(x.grad, xt.grad)


# --------------------------------------------------------------------------
# 8. broadcasting-heavy programs
# --------------------------------------------------------------------------
def test_broadcast_bias_adds_and_normalisation_over_different_axes(torch, rng):
    x_np = rng.normal(size=(4, 3, 5)) * 2 + 1
    a_np = rng.normal(size=(3, 1))         # per channel, broadcast over (N, ., L)
    b_np = rng.normal(size=(5,))           # per position
    c_np = rng.normal(size=(1, 3, 1))
    s_np = np.array(1.7)                   # a 0-d parameter
    o_np = rng.normal(size=(1,))           # a (1,) parameter
    names = ("x", "a", "b", "c", "s", "o")
    vals = (x_np, a_np, b_np, c_np, s_np, o_np)

    ts = {k: gc.tensor(v) for k, v in zip(names, vals)}
    gm = GradManager().attach(list(ts.values()))
    with gm:
        x, a, b, c, s, o = (ts[k] for k in names)
        h = x * a + b                                              # (4,3,5)
        h = (h - h.mean(axis=(0, 2), keepdims=True)) / F.std(h, axis=(0, 2), keepdims=True)
        h = h * c + s
        m = h.max(axis=1, keepdims=True)
        h = h - m + F.var(h, axis=0, keepdims=True) * o            # (4,3,5) + (1,3,5)
        r = h / F.norm(h, axis=-1, keepdims=True)
        r = r + F.broadcast_to(F.expand_dims(b, 0), (3, 5)) * h.min(axis=0)
        loss = (r * F.cos(x)).sum() + F.logsumexp(r, axis=2).mean() + h.sum(axis=(1, 2)).prod()
        gm.backward(loss)

    t = {k: tt(torch, v) for k, v in zip(names, vals)}
    x, a, b, c, s, o = (t[k] for k in names)
    h = x * a + b
    h = (h - h.mean(dim=(0, 2), keepdim=True)) / h.std(dim=(0, 2), keepdim=True, correction=0)
    h = h * c + s
    m = h.max(dim=1, keepdim=True).values
    h = h - m + h.var(dim=0, keepdim=True, correction=0) * o
    r = h / torch.linalg.vector_norm(h, dim=-1, keepdim=True)
    r = r + torch.broadcast_to(b[None], (3, 5)) * h.min(dim=0).values
    tloss = (r * torch.cos(x)).sum() + torch.logsumexp(r, 2).mean() + h.sum(dim=(1, 2)).prod()
    tloss.backward()
    close(loss, tloss, rtol=1e-9, atol=1e-9)
    for k in names:
        assert ts[k].grad.shape == ts[k].shape, k
        close(ts[k].grad, t[k].grad, rtol=1e-8, atol=1e-9)


def test_norm_layers_over_different_axes(torch, rng):
    """layer_norm over 2 trailing axes, group norm, instance norm, and
    F.normalize along an inner axis, with their affine parameters."""
    tf = torch.nn.functional
    x_np = rng.normal(size=(3, 4, 2, 5)) * 3 - 1
    lw, lb = 1 + rng.normal(size=(2, 5)) * 0.1, rng.normal(size=(2, 5)) * 0.1
    gw, gb = 1 + rng.normal(size=4) * 0.1, rng.normal(size=4) * 0.1
    names = ("x", "lw", "lb", "gw", "gb")
    vals = (x_np, lw, lb, gw, gb)
    ts = {k: gc.tensor(v) for k, v in zip(names, vals)}
    gm = GradManager().attach(list(ts.values()))
    with gm:
        x = ts["x"]
        y1 = F.nn.layer_norm(x, (2, 5), True, ts["lw"], ts["lb"], eps=1e-6)
        y2 = F.nn.group_norm(y1 * x, 2, True, ts["gw"], ts["gb"])
        y3 = F.nn.group_norm(y2, 4, False)                          # instance norm
        y4 = F.nn.normalize(y3 + x, ord=2, axis=1)
        loss = (y4 * F.sin(x)).sum() + (y2 ** 2).mean()
        gm.backward(loss)
    out = y4

    t = {k: tt(torch, v) for k, v in zip(names, vals)}
    x = t["x"]
    y1 = tf.layer_norm(x, (2, 5), t["lw"], t["lb"], eps=1e-6)
    y2 = tf.group_norm(y1 * x, 2, t["gw"], t["gb"])
    y3 = tf.instance_norm(y2)
    y4 = tf.normalize(y3 + x, p=2, dim=1)
    tloss = (y4 * torch.sin(x)).sum() + (y2 ** 2).mean()
    tloss.backward()
    close(out, y4)
    close(loss, tloss)
    for k in names:
        close(ts[k].grad, t[k].grad, rtol=1e-8, atol=1e-10)


def test_batched_matmul_broadcasting_over_batch_dims(torch, rng):
    a_np = rng.normal(size=(2, 1, 3, 4))
    b_np = rng.normal(size=(5, 4, 2))       # broadcasts to (2, 5, 4, 2)
    v_np = rng.normal(size=(4,))            # matrix @ vector
    a, b, v = gc.tensor(a_np), gc.tensor(b_np), gc.tensor(v_np)
    gm = GradManager().attach([a, b, v])
    with gm:
        p = F.matmul(a, b)                              # (2, 5, 3, 2)
        q = F.matmul(a, v)                              # (2, 1, 3)
        r = F.matmul(b, b, transpose_a=True)            # (5, 2, 2)
        loss = (p ** 2).sum() + (q * F.sigmoid(q)).sum() + F.tanh(r).sum() + F.dot(v, v)
        gm.backward(loss)
    at, bt, vt = tt(torch, a_np), tt(torch, b_np), tt(torch, v_np)
    p, q, r = at @ bt, at @ vt, bt.transpose(-1, -2) @ bt
    tloss = (p ** 2).sum() + (q * torch.sigmoid(q)).sum() + torch.tanh(r).sum() + vt @ vt
    tloss.backward()
    close(loss, tloss)
    close(a.grad, at.grad)
    close(b.grad, bt.grad)
    close(v.grad, vt.grad)


# --------------------------------------------------------------------------
# 9. numerics: extreme logits, large logsumexp, sqrt/div near 0, var/std
# --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cross_entropy_and_log_softmax_with_extreme_logits(torch, dtype):
    logits_np = np.array([[1e4, -1e4, 0.0, 3.0],
                          [-5e3, -5e3, -5e3, -5e3],
                          [88.0, 89.0, -90.0, 0.0],
                          [-1e4, 1e4, 1e4 - 1, 20.0]], dtype)
    y_np = np.array([1, 2, 0, 1])
    tol = F64 if dtype == "float64" else dict(rtol=1e-5, atol=1e-6)
    for smooth in (0.0, 0.1):
        x = gc.tensor(logits_np)
        gm = GradManager().attach([x])
        with gm:
            loss = F.cross_entropy(x * 1.0, gc.tensor(y_np), label_smooth=smooth, reduction="sum")
            lsm = F.log_softmax(x, axis=1)
            sm = F.softmax(x, axis=1)
            total = loss + (lsm[:, 3] * 1e-3).sum() + (sm * sm).sum()
            gm.backward(total)
        xt = tt(torch, logits_np)
        tloss = torch.nn.functional.cross_entropy(xt * 1.0, torch.tensor(y_np), label_smoothing=smooth,
                                                  reduction="sum")
        tlsm = torch.log_softmax(xt, 1)
        tsm = torch.softmax(xt, 1)
        (tloss + (tlsm[:, 3] * 1e-3).sum() + (tsm * tsm).sum()).backward()
        assert np.isfinite(loss.item())
        assert loss.dtype == np.dtype(dtype) and x.grad.dtype == np.dtype(dtype)
        close(loss, tloss, **tol)
        close(lsm, tlsm, **tol)
        close(sm, tsm, **tol)
        close(x.grad, xt.grad, **tol)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_logsumexp_with_huge_and_infinite_values(torch):
    x_np = np.array([[1e300, 1e300, -np.inf, 0.0],
                     [700.0, 710.0, 709.0, -np.inf],
                     [-1e300, -1e300, -1e300, -1e300],
                     [1.0, 2.0, 3.0, 4.0]])
    x = gc.tensor(x_np)
    gm = GradManager().attach([x])
    with gm:
        a = F.logsumexp(x, axis=1)
        b = F.logsumexp(x[1:, :], axis=(0, 1))          # several axes: the composite path
        c = F.logsumexp(x[1:2], axis=0, keepdims=True)
        loss = (a * gc.tensor([1e-300, 1.0, 1e-300, 2.0])).sum() + b + c.sum()
        gm.backward(loss)
    xt = tt(torch, x_np)
    at = torch.logsumexp(xt, 1)
    bt = torch.logsumexp(xt[1:], (0, 1))
    ct = torch.logsumexp(xt[1:2], 0, keepdim=True)
    (at * torch.tensor([1e-300, 1.0, 1e-300, 2.0])).sum().add(bt).add(ct.sum()).backward()
    close(a, at)
    close(b, bt)
    close(c, ct)
    close(x.grad, xt.grad)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_sqrt_and_division_near_zero(torch):
    x_np = np.array([0.0, 1e-160, -1e-10, 3.0, 1e-300])
    y_np = np.array([1e-200, -1e-150, 2.0, 1e-8, 1.0])
    x, y = gc.tensor(x_np), gc.tensor(y_np)
    gm = GradManager().attach([x, y])
    with gm:
        r = F.sqrt(x * x + 1e-30)                   # a smoothed |x|
        q = x / (F.abs(y) + 1e-300)
        n = F.norm(F.stack([x, x * 0], 0), axis=0)  # zero columns: a 0 subgradient
        s = F.sqrt(F.maximum(x, 0) + 1e-12)
        loss = r.sum() + (q * 1e-150).sum() + n.sum() + s.sum()
        gm.backward(loss)
    xt, yt = tt(torch, x_np), tt(torch, y_np)
    r_t = torch.sqrt(xt * xt + 1e-30)
    q_t = xt / (yt.abs() + 1e-300)
    n_t = torch.linalg.vector_norm(torch.stack([xt, xt * 0], 0), dim=0)
    s_t = torch.sqrt(torch.clamp(xt, min=0) + 1e-12)
    (r_t.sum() + (q_t * 1e-150).sum() + n_t.sum() + s_t.sum()).backward()
    close(r, r_t)
    close(q, q_t)
    close(n, n_t)
    close(x.grad, xt.grad)
    close(y.grad, yt.grad)


def test_var_std_program_with_constant_and_offset_data(torch, rng):
    """Standardisation of features, one of them constant (std 0: gradient 0
    in both), one with a large offset (cancellation in the variance)."""
    x_np = rng.normal(size=(6, 4))
    x_np[:, 1] = 2.5                   # constant column
    x_np[:, 2] += 1e6                  # large offset
    w_np = rng.normal(size=(4,))
    x, w = gc.tensor(x_np), gc.tensor(w_np)
    gm = GradManager().attach([x, w])
    with gm:
        sd = F.std(x, axis=0, keepdims=True)
        z = (x - x.mean(axis=0, keepdims=True)) / (sd + 1e-6)
        v = F.var(x * w, axis=0)
        loss = (z * w).sum() + F.std(x * w).sum() + (v * F.sigmoid(w)).sum() + F.std(x[:, 1]).sum()
        gm.backward(loss)
    xt, wt = tt(torch, x_np), tt(torch, w_np)
    sdt = xt.std(0, keepdim=True, correction=0)
    zt = (xt - xt.mean(0, keepdim=True)) / (sdt + 1e-6)
    vt = (xt * wt).var(0, correction=0)
    tloss = (zt * wt).sum() + (xt * wt).std(correction=0) + (vt * torch.sigmoid(wt)).sum() \
        + xt[:, 1].std(correction=0)
    tloss.backward()
    close(sd, sdt, rtol=1e-9, atol=1e-12)
    close(loss, tloss, rtol=1e-9, atol=1e-9)
    close(x.grad, xt.grad, rtol=1e-7, atol=1e-9)
    close(w.grad, wt.grad, rtol=1e-7, atol=1e-9)


def test_binary_cross_entropy_and_softplus_with_moderate_logits(torch, rng):
    pred_np = np.array([-12.0, -3.0, 0.0, 4.0, 15.0, 40.0, -40.0])
    label_np = np.array([1.0, 0.0, 0.5, 1.0, 0.0, 1.0, 0.0])
    p = gc.tensor(pred_np)
    gm = GradManager().attach([p])
    with gm:
        loss = F.nn.binary_cross_entropy(p, gc.tensor(label_np), reduction="sum")
        gm.backward(loss)
    pt = tt(torch, pred_np)
    tloss = torch.nn.functional.binary_cross_entropy_with_logits(pt, torch.tensor(label_np), reduction="sum")
    tloss.backward()
    close(loss, tloss)
    # the gradient is sigmoid(p) - label: compared with an absolute tolerance
    close(p.grad, pt.grad, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sigmoid_family_relative_precision_in_the_negative_tail(torch, dtype):
    x_np = np.array([-5.0, -10.0, -20.0, -30.0, -40.0, -60.0], dtype)
    x = gc.tensor(x_np)
    gm = GradManager().attach([x])
    with gm:
        s = F.sigmoid(x)
        sp = F.nn.softplus(x)
        ls = F.nn.logsigmoid(-x)
        si = F.nn.silu(x)
        gm.backward(s.sum() + sp.sum() + ls.sum() + si.sum())
    xt = tt(torch, x_np)
    tf = torch.nn.functional
    st, spt, lst, sit = torch.sigmoid(xt), tf.softplus(xt), tf.logsigmoid(-xt), tf.silu(xt)
    (st.sum() + spt.sum() + lst.sum() + sit.sum()).backward()
    tol = dict(rtol=1e-9, atol=0) if dtype == "float64" else dict(rtol=1e-5, atol=0)
    close(s, st, **tol)
    close(sp, spt, **tol)
    close(si, sit, **tol)
    close(x.grad, xt.grad, **tol)


# --------------------------------------------------------------------------
# 10. more programs: dropout with a recovered mask, gradient penalty through
# a CNN, callbacks as gradient clipping, param groups and schedules, more ops
# --------------------------------------------------------------------------
def test_dropout_training_step_with_the_same_mask(torch, rng):
    """gradcore draws its own mask; the torch side reuses it (recovered from
    the output), so the programs compute the same function."""
    gc.random.seed(3)
    x_np = rng.normal(size=(8, 10)) + 3.0          # never 0: the mask is recoverable
    w_np = rng.normal(size=(10, 4))
    x, w = gc.tensor(x_np), gc.Parameter(w_np)
    gm = GradManager().attach([x, w])
    with gm:
        d = F.dropout(x, 0.3)
        loss = F.cross_entropy(F.matmul(d, w), gc.tensor(np.arange(8) % 4))
        gm.backward(loss)
    mask = d.numpy() / x_np
    assert set(np.round(np.unique(mask), 12)) <= {0.0, round(1 / 0.7, 12)}
    assert 0 < (mask == 0).sum() < mask.size
    xt, wt = tt(torch, x_np), tt(torch, w_np)
    tloss = torch.nn.functional.cross_entropy((xt * torch.tensor(mask)) @ wt, torch.tensor(np.arange(8) % 4))
    tloss.backward()
    close(loss, tloss)
    close(x.grad, xt.grad)
    close(w.grad, wt.grad)
    # eval mode / training=False is the identity, and so is p=0
    close(F.dropout(x, 0.3, training=False), x_np)
    close(M.Dropout(0.5).eval()(x), x_np)


def test_gradient_penalty_through_conv_pool_and_batch_norm(torch, rng):
    tf = torch.nn.functional
    x_np = rng.normal(size=(3, 2, 6, 6))
    w1_np = rng.normal(size=(4, 2, 3, 3)) * 0.4
    w2_np = rng.normal(size=(1, 4, 3, 3)) * 0.4
    g_np = 1 + 0.1 * rng.normal(size=4)
    w1, w2, g = gc.Parameter(w1_np), gc.Parameter(w2_np), gc.Parameter(g_np)
    x = gc.tensor(x_np)
    outer, inner = GradManager().attach([w1, w2, g]), GradManager().attach([x])
    with outer:
        with inner:
            h = F.conv2d(x, w1, padding=1)
            h = F.batch_norm(h, weight=g, training=True)
            h = F.max_pool2d(F.nn.softplus(h), 2)
            h = F.avg_pool2d(F.conv2d(h, w2, padding=1), 3)
            out = h.sum(axis=(1, 2, 3))
            inner.backward(out.sum())
        gx = x.grad
        loss = out.mean() + ((gx ** 2).sum(axis=(1, 2, 3)) - 1).mean() ** 2
        outer.backward(loss)

    xt = tt(torch, x_np)
    w1t, w2t, gt = tt(torch, w1_np), tt(torch, w2_np), tt(torch, g_np)
    h = tf.conv2d(xt, w1t, padding=1)
    h = tf.batch_norm(h, None, None, gt, None, training=True)
    h = tf.max_pool2d(tf.softplus(h), 2)
    h = tf.avg_pool2d(tf.conv2d(h, w2t, padding=1), 3)
    out_t = h.sum((1, 2, 3))
    (gxt,) = torch.autograd.grad(out_t.sum(), xt, create_graph=True)
    tloss = out_t.mean() + ((gxt ** 2).sum((1, 2, 3)) - 1).mean() ** 2
    tloss.backward()
    close(gx, gxt)
    close(loss, tloss)
    close(w1.grad, w1t.grad, rtol=1e-8, atol=1e-10)
    close(w2.grad, w2t.grad, rtol=1e-8, atol=1e-10)
    close(g.grad, gt.grad, rtol=1e-8, atol=1e-10)


def test_gradient_clipping_callback_and_param_groups_with_a_schedule(torch, rng):
    """attach callbacks scale each gradient (per-tensor norm clipping, as
    torch.nn.utils.clip_grad_norm_ on each tensor), two parameter groups
    with their own lr and weight decay, and a MultiStepLR schedule."""
    x_np, y_np = rng.normal(size=(10, 3)), rng.normal(size=(10, 2))
    w_np, b_np = rng.normal(size=(2, 3)) * 3, rng.normal(size=2)
    w, b = gc.Parameter(w_np), gc.Parameter(b_np)
    wt, bt = tt(torch, w_np), tt(torch, b_np)

    def clip(tensor, grad, max_norm=0.5):
        n = F.norm(grad)
        return grad * F.minimum(max_norm / (n + 1e-6), 1.0)
    gm = GradManager().attach([w, b], callbacks=[clip])
    opt = optim.SGD([{"params": [w], "weight_decay": 1e-2}, {"params": [b], "lr": 0.3}],
                    lr=0.1, momentum=0.9)
    sched = optim.MultiStepLR(opt, milestones=[3, 6], gamma=0.5)
    topt = torch.optim.SGD([{"params": [wt], "weight_decay": 1e-2}, {"params": [bt], "lr": 0.3}],
                           lr=0.1, momentum=0.9)
    tsched = torch.optim.lr_scheduler.MultiStepLR(topt, milestones=[3, 6], gamma=0.5)
    for _ in range(8):
        with gm:
            loss = F.nn.square_loss(F.linear(gc.tensor(x_np), w, b), gc.tensor(y_np))
            gm.backward(loss)
        opt.step().clear_grad()
        sched.step()
        tloss = torch.nn.functional.mse_loss(torch.nn.functional.linear(torch.tensor(x_np), wt, bt),
                                             torch.tensor(y_np))
        topt.zero_grad()
        tloss.backward()
        for p in (wt, bt):
            torch.nn.utils.clip_grad_norm_([p], 0.5)
        topt.step()
        tsched.step()
        close(loss, tloss, rtol=1e-7, atol=1e-9)
    close(w, wt, rtol=1e-6, atol=1e-8)
    close(b, bt, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kind", ["AdamW", "Adagrad", "Adadelta"])
def test_other_optimizers_train_the_same_model(torch, rng, kind):
    x_np, y_np = rng.normal(size=(12, 4)), rng.integers(0, 3, 12)
    w_np, b_np = rng.normal(size=(3, 4)), rng.normal(size=3)
    kwargs = {"AdamW": dict(lr=0.05, weight_decay=0.1), "Adagrad": dict(lr=0.2, weight_decay=1e-3),
              "Adadelta": dict(lr=1.0, rho=0.8, weight_decay=1e-3)}[kind]
    w, b = gc.Parameter(w_np), gc.Parameter(b_np)
    wt, bt = tt(torch, w_np), tt(torch, b_np)
    opt = getattr(optim, kind)([w, b], **kwargs)
    topt = getattr(torch.optim, kind)([wt, bt], **kwargs)
    gm = GradManager().attach([w, b])
    for _ in range(10):
        with gm:
            loss = F.cross_entropy(F.linear(gc.tensor(x_np), w, b), gc.tensor(y_np))
            gm.backward(loss)
        opt.step().clear_grad()
        tloss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(torch.tensor(x_np), wt, bt),
                                                  torch.tensor(y_np))
        topt.zero_grad()
        tloss.backward()
        topt.step()
        close(loss, tloss, rtol=1e-6, atol=1e-8)
    # Adagrad: gradcore adds eps inside the sqrt (MegEngine), torch outside
    close(w, wt, rtol=1e-6, atol=1e-7)
    close(b, bt, rtol=1e-6, atol=1e-7)


def test_sequence_model_with_modules_float32(torch, rng):
    """Embedding -> Conv1d -> BatchNorm1d -> PReLU -> LayerNorm -> mean over
    time -> Linear, trained 4 steps with Adam; float32."""
    nn = torch.nn

    class TNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 6)
            self.conv = nn.Conv1d(6, 8, 3, padding=1, bias=False)   # (BN follows: a bias would get 0 gradients, noise under Adam)
            self.bn = nn.BatchNorm1d(8, momentum=0.25)
            self.act = nn.PReLU()
            self.ln = nn.LayerNorm(8)
            self.fc = nn.Linear(8, 3)

        def forward(self, ids):
            h = self.emb(ids).permute(0, 2, 1)
            h = self.act(self.bn(self.conv(h)))
            h = self.ln(h.permute(0, 2, 1))
            return self.fc(h.mean(1))

    class GNet(M.Module):
        def __init__(self):
            super().__init__()
            self.emb = M.Embedding(11, 6)
            self.conv = M.Conv1d(6, 8, 3, padding=1, bias=False)
            self.bn = M.BatchNorm1d(8, momentum=0.75)
            self.act = M.PReLU()
            self.ln = M.LayerNorm(8)
            self.fc = M.Linear(8, 3)

        def forward(self, ids):
            h = F.transpose(self.emb(ids), (0, 2, 1))
            h = self.act(self.bn(self.conv(h)))
            h = self.ln(F.transpose(h, (0, 2, 1)))
            return self.fc(h.mean(axis=1))

    torch.manual_seed(1)
    tnet, net = TNet(), GNet()
    load_from_torch(net, tnet)
    opt, topt = optim.Adam(net.parameters(), lr=0.02), torch.optim.Adam(tnet.parameters(), lr=0.02)
    gm = GradManager().attach(net.parameters())
    for _ in range(4):
        ids_np = rng.integers(0, 11, size=(5, 7))
        y_np = rng.integers(0, 3, 5)
        with gm:
            loss = F.cross_entropy(net(gc.tensor(ids_np.astype("int32"))), gc.tensor(y_np))
            gm.backward(loss)
        opt.step().clear_grad()
        tloss = torch.nn.functional.cross_entropy(tnet(torch.tensor(ids_np)), torch.tensor(y_np))
        topt.zero_grad()
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
    tstate = tnet.state_dict()
    for k, v in net.state_dict().items():
        close(np.asarray(v).reshape(tstate[k].shape), tstate[k], rtol=1e-4, atol=1e-5)
    net.eval()
    tnet.eval()
    ids_np = rng.integers(0, 11, size=(2, 7))
    close(net(gc.tensor(ids_np)), tnet(torch.tensor(ids_np)), rtol=1e-4, atol=1e-5)


def test_program_with_sort_topk_cumsum_and_shape_ops(torch, rng):
    x_np = rng.normal(size=(3, 8))
    x = gc.tensor(x_np)
    gm = GradManager().attach([x])
    with gm:
        s, _ = F.sort(x, descending=True)
        tk, _ = F.topk(x, 3, descending=True)
        c = F.cumsum(F.exp(x), axis=1)
        parts = F.split(x, [2, 5], axis=1)
        cat = F.concat([parts[2], parts[0] * 2, parts[1]], axis=1)
        r = F.repeat(x[:, :2], 2, axis=1) * F.tile(x[:1, :4], (3, 1))
        rolled = F.roll(x, 3, axis=1)
        pr = F.prod(x[:, :4] + 2, axis=1)
        loss = (s * gc.tensor(np.linspace(1, 2, 8))).sum() + (tk ** 2).sum() + F.log(c).sum() \
            + (cat * rolled).sum() + r.sum() + pr.sum() + F.flatten(x).max()
        gm.backward(loss)
    xt = tt(torch, x_np)
    st = torch.sort(xt, 1, descending=True).values
    tkt = torch.topk(xt, 3, 1).values
    ct = torch.cumsum(torch.exp(xt), 1)
    p = torch.split(xt, [2, 3, 3], 1)
    catt = torch.cat([p[2], p[0] * 2, p[1]], 1)
    rt = torch.repeat_interleave(xt[:, :2], 2, 1) * xt[:1, :4].tile(3, 1)
    rollt = torch.roll(xt, 3, 1)
    prt = torch.prod(xt[:, :4] + 2, 1)
    tloss = (st * torch.tensor(np.linspace(1, 2, 8))).sum() + (tkt ** 2).sum() + torch.log(ct).sum() \
        + (catt * rollt).sum() + rt.sum() + prt.sum() + xt.flatten().max()
    tloss.backward()
    close(loss, tloss)
    close(x.grad, xt.grad)


def test_inplace_updates_and_index_writes_in_the_forward(torch, rng):
    """+=, *=, -=, /=, **= on a recorded tensor, augmented assignment into a
    slice and a row, a boolean-mask write, then a column written from two
    others."""
    x_np, b_np, v_np = rng.normal(size=(4, 3)), rng.normal(size=3), rng.normal(size=(2, 3))
    mask_np = x_np > 0

    def program(x, b, v, mask, is_torch):
        h = x * 1
        h += b
        h *= 2
        h -= x
        h /= 3
        h **= 2
        h[1:3] += v
        h[0] *= b
        h[mask] = (x * 5)[mask]
        if is_torch:       # torch refuses to differentiate through views it saved and then saw written
            h[:, 0] = h[:, 1].clone() * h[:, 2].clone()
        else:
            h[:, 0] = h[:, 1] * h[:, 2]
        return (h ** 2).sum()

    x, b, v = gc.tensor(x_np), gc.tensor(b_np), gc.tensor(v_np)
    gm = GradManager().attach([x, b, v])
    with gm:
        loss = program(x, b, v, gc.tensor(mask_np), False)
        gm.backward(loss)
    xt, bt, vt = tt(torch, x_np), tt(torch, b_np), tt(torch, v_np)
    tloss = program(xt, bt, vt, torch.tensor(mask_np), True)
    tloss.backward()
    close(loss, tloss)
    close(x.grad, xt.grad)
    close(b.grad, bt.grad)
    close(v.grad, vt.grad)


def test_tiny_super_resolution_net(torch, rng):
    """reflect padding -> conv -> pixel shuffle -> adaptive average pool (a
    size that divides: the same bins as torch) -> loss against a target."""
    tf = torch.nn.functional
    x_np = rng.normal(size=(2, 1, 4, 4))
    w_np = rng.normal(size=(4, 1, 3, 3)) * 0.5
    target_np = rng.normal(size=(2, 1, 4, 4))
    x, w = gc.tensor(x_np), gc.Parameter(w_np)
    gm = GradManager().attach([x, w])
    with gm:
        h = F.nn.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="reflect")
        h = F.nn.pixel_shuffle(F.conv2d(h, w), 2)             # (2, 1, 8, 8)
        y = F.nn.adaptive_avg_pool2d(h, (4, 4))
        loss = F.nn.l1_loss(y, gc.tensor(target_np)) + F.nn.square_loss(h[:, :, ::2, ::2], gc.tensor(target_np))
        gm.backward(loss)
    xt, wt = tt(torch, x_np), tt(torch, w_np)
    h = tf.pad(xt, (1, 1, 1, 1), mode="reflect")
    h = tf.pixel_shuffle(tf.conv2d(h, wt), 2)
    yt = tf.adaptive_avg_pool2d(h, (4, 4))
    tloss = tf.l1_loss(yt, torch.tensor(target_np)) + tf.mse_loss(h[:, :, ::2, ::2], torch.tensor(target_np))
    tloss.backward()
    close(y, yt)
    close(loss, tloss)
    close(x.grad, xt.grad)
    close(w.grad, wt.grad)


# --------------------------------------------------------------------------
# discrepancies these programs found, fixed since (kinks, zero norms, tails)
# --------------------------------------------------------------------------
def test_input_saliency_of_elu_prelu_net_on_sparse_inputs(torch, rng):
    """Input gradient (saliency) of a network whose first layers are ELU and
    PReLU, on sparse features holding exact zeros."""
    x_np = rng.normal(size=(4, 6)) * (rng.random((4, 6)) < 0.5)     # about half exact zeros
    assert (x_np == 0).any()
    a_np = np.array([0.25])
    w_np = rng.normal(size=(6, 3))
    x, a, w = gc.tensor(x_np), gc.tensor(a_np), gc.tensor(w_np)
    gm = GradManager().attach([x, a, w])
    with gm:
        h = F.elu(x, 0.7) + F.prelu(x, a)
        loss = F.logsumexp(F.matmul(h, w), axis=1).sum()
        gm.backward(loss)
    xt, at, wt = tt(torch, x_np), tt(torch, a_np), tt(torch, w_np)
    h = torch.nn.functional.elu(xt, 0.7) + torch.nn.functional.prelu(xt, at)
    tloss = torch.logsumexp(h @ wt, 1).sum()
    tloss.backward()
    close(loss, tloss)
    close(w.grad, wt.grad)
    close(a.grad, at.grad)
    close(x.grad, xt.grad)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_group_sparsity_penalty_with_a_zero_row(torch, rng):
    """A per-row 3-norm penalty on a weight matrix with a row that is exactly
    zero (a pruned unit), trained with the data loss."""
    w_np = rng.normal(size=(4, 5))
    w_np[2] = 0.0
    x_np, y_np = rng.normal(size=(6, 5)), rng.normal(size=(6, 4))
    w = gc.Parameter(w_np)
    gm = GradManager().attach([w])
    with gm:
        loss = F.nn.square_loss(F.linear(gc.tensor(x_np), w), gc.tensor(y_np)) + 0.1 * F.norm(w, 3, axis=1).sum()
        gm.backward(loss)
    wt = tt(torch, w_np)
    tloss = torch.nn.functional.mse_loss(torch.tensor(x_np) @ wt.T, torch.tensor(y_np)) \
        + 0.1 * torch.linalg.vector_norm(wt, 3, dim=1).sum()
    tloss.backward()
    close(loss, tloss)
    close(w.grad, wt.grad)


def test_angle_features_including_the_origin(torch):
    pts_np = np.array([[0.0, 0.0], [1.0, 1.0], [-1.0, 0.5], [0.0, -2.0]])
    p = gc.tensor(pts_np)
    gm = GradManager().attach([p])
    with gm:
        ang = F.atan2(p[:, 1], p[:, 0])
        loss = (F.sin(ang) + ang).sum()
        gm.backward(loss)
    pt = tt(torch, pts_np)
    ang_t = torch.atan2(pt[:, 1], pt[:, 0])
    (torch.sin(ang_t) + ang_t).sum().backward()
    close(ang, ang_t)
    close(p.grad, pt.grad)


def test_lstm_cell_unrolled_with_gates(torch, rng):
    """An LSTM cell (sigmoid/tanh gates from one fused matmul, split into
    four) unrolled 8 steps; the loss reads every hidden state."""
    n, din, dh, steps = 3, 4, 5, 8
    xs_np = rng.normal(size=(steps, n, din))
    w_np = rng.normal(size=(din + dh, 4 * dh)) * 0.4
    b_np = rng.normal(size=4 * dh) * 0.1

    def run(lib, xs, w, b):
        if lib == "gc":
            cat, split, sig, tanh = (lambda a: F.concat(a, axis=1)), (lambda a: F.split(a, 4, axis=1)), \
                F.sigmoid, F.tanh
            h = c = gc.tensor(np.zeros((n, dh)))
        else:
            cat, split, sig, tanh = (lambda a: torch.cat(a, 1)), (lambda a: torch.split(a, dh, 1)), \
                torch.sigmoid, torch.tanh
            h = c = torch.zeros(n, dh, dtype=torch.float64)
        loss = 0
        for t in range(steps):
            z = cat([xs[t], h]) @ w + b
            i, f, g, o = split(z)
            c = sig(f) * c + sig(i) * tanh(g)
            h = sig(o) * tanh(c)
            loss = loss + (h * (t + 1)).sum() * 0.1 + (c ** 2).mean()
        return loss

    xs, w, b = gc.tensor(xs_np), gc.Parameter(w_np), gc.Parameter(b_np)
    gm = GradManager().attach([xs, w, b])
    with gm:
        loss = run("gc", xs, w, b)
        gm.backward(loss)
    xst, wt, bt = tt(torch, xs_np), tt(torch, w_np), tt(torch, b_np)
    tloss = run("torch", xst, wt, bt)
    tloss.backward()
    close(loss, tloss)
    close(xs.grad, xst.grad)
    close(w.grad, wt.grad)
    close(b.grad, bt.grad)


def test_gan_style_alternating_updates_with_two_managers(torch, rng):
    """A generator and a critic, each with its own GradManager and Adam;
    the critic step sees the generator's output detached."""
    z_np = rng.normal(size=(8, 2))
    real_np = rng.normal(size=(8, 3)) + 1.0
    gw_np, dw_np = rng.normal(size=(2, 3)), rng.normal(size=(3, 1))
    gw, dw = gc.Parameter(gw_np), gc.Parameter(dw_np)
    gwt, dwt = tt(torch, gw_np), tt(torch, dw_np)
    gopt, dopt = optim.Adam([gw], lr=0.05, betas=(0.5, 0.9)), optim.Adam([dw], lr=0.05, betas=(0.5, 0.9))
    gopt_t = torch.optim.Adam([gwt], lr=0.05, betas=(0.5, 0.9))
    dopt_t = torch.optim.Adam([dwt], lr=0.05, betas=(0.5, 0.9))
    ggm, dgm = GradManager().attach([gw]), GradManager().attach([dw])
    z, real = gc.tensor(z_np), gc.tensor(real_np)
    zt, realt = torch.tensor(z_np), torch.tensor(real_np)
    tf = torch.nn.functional
    for _ in range(5):
        fake = F.tanh(F.matmul(z, gw))
        with dgm:
            d_loss = F.nn.softplus(-F.matmul(real, dw)).mean() + F.nn.softplus(F.matmul(fake.detach(), dw)).mean()
            dgm.backward(d_loss)
        dopt.step().clear_grad()
        with ggm:
            g_loss = F.nn.softplus(-F.matmul(F.tanh(F.matmul(z, gw)), dw)).mean()
            ggm.backward(g_loss)
        gopt.step().clear_grad()
        assert dw.grad is None and gw.grad is None

        fake_t = torch.tanh(zt @ gwt)
        d_loss_t = tf.softplus(-(realt @ dwt)).mean() + tf.softplus(fake_t.detach() @ dwt).mean()
        dopt_t.zero_grad()
        d_loss_t.backward()
        dopt_t.step()
        g_loss_t = tf.softplus(-(torch.tanh(zt @ gwt) @ dwt)).mean()
        gopt_t.zero_grad()
        g_loss_t.backward()
        gopt_t.step()
        close(d_loss, d_loss_t)
        close(g_loss, g_loss_t)
    close(gw, gwt, rtol=1e-8, atol=1e-10)
    close(dw, dwt, rtol=1e-8, atol=1e-10)
