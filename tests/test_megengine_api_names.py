"""Names and signatures of MegEngine's public API that gradcore matches:
keyword-only creation arguments, F.debug_param's execution strategy,
F.metric, the gradcore.optimizer.lr_scheduler path and the logging helpers
(get_logger, set_log_level, set_log_file, enable_debug_log)."""
import importlib
import inspect
import io
import logging

import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.optimizer as optim
from gradcore import logger as gc_logger


@pytest.mark.parametrize("fn, args", [(F.zeros, ((2,),)), (F.ones, ((2,),)), (F.full, ((2,), 1.0)),
                                      (F.arange, (0, 4, 1)), (F.linspace, (0, 1, 3)), (F.eye, (2, 2))])
def test_creation_dtype_and_device_are_keyword_only(fn, args):
    params = inspect.signature(fn).parameters
    assert params["dtype"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["device"].kind is inspect.Parameter.KEYWORD_ONLY
    assert fn(*args, dtype="int32", device="cpu").dtype == "int32"
    with pytest.raises(TypeError):
        fn(*args, "int32")


@pytest.fixture
def restore_strategy():
    from gradcore.functional import debug_param
    before = debug_param.get_execution_strategy()
    yield debug_param
    debug_param.set_execution_strategy(before)


def test_execution_strategy_round_trips(restore_strategy):
    dp = restore_strategy
    assert F.debug_param is dp
    for option, want in [("HEURISTIC", dp.Strategy.HEURISTIC), ("PROFILE", dp.Strategy.PROFILE),
                         ("PROFILE_REPRODUCIBLE", dp.Strategy.PROFILE | dp.Strategy.REPRODUCIBLE),
                         ("HEURISTIC_REPRODUCIBLE", dp.Strategy.HEURISTIC | dp.Strategy.REPRODUCIBLE)]:
        dp.set_execution_strategy(option)
        assert dp.get_execution_strategy() == want, option
        assert dp.get_conv_execution_strategy() == want
    dp.set_conv_execution_strategy(dp.Strategy.PROFILE)
    assert dp.get_execution_strategy() == dp.Strategy.PROFILE
    with pytest.raises(ValueError, match="set_execution_strategy.*'FAST'"):
        dp.set_execution_strategy("PROFILE_FAST")
    with pytest.raises(TypeError, match="set_execution_strategy"):
        dp.set_execution_strategy(3.0)


def test_metric_module_path():
    assert F.metric.topk_accuracy is F.nn.topk_accuracy
    logits = gc.tensor([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]])
    top1, top2 = F.metric.topk_accuracy(logits, gc.tensor([2, 1], dtype="int32"), (1, 2))
    assert float(top1) == 0.0 and float(top2) == 1.0


def test_lr_scheduler_importable_under_optimizer():
    mod = importlib.import_module("gradcore.optimizer.lr_scheduler")
    assert mod is gc.lr_scheduler and optim.lr_scheduler is mod
    from gradcore.optimizer.lr_scheduler import LRScheduler, MultiStepLR
    assert MultiStepLR is optim.MultiStepLR and issubclass(MultiStepLR, LRScheduler)


@pytest.fixture
def clean_logging():
    saved = (list(gc_logger._loggers), dict(gc_logger._state))
    levels = {name: logging.getLogger(name).level for name in ("gradcore", "gradcore.t1", "t2")}
    yield
    gc.set_log_file(io.StringIO())
    for lg in set(gc_logger._loggers) | {logging.getLogger("gradcore")}:
        lg.removeHandler(gc_logger._state["file_handler"])
    gc_logger._loggers[:] = saved[0]
    gc_logger._state.update(saved[1])
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_logging_helpers(clean_logging, tmp_path):
    assert inspect.signature(gc.get_logger).parameters["name"].default is None
    assert gc.get_logger().name == "gradcore"
    old = gc.set_log_level(logging.ERROR)
    assert gc.get_logger("t2").level == logging.ERROR       # made after: the new default
    assert gc.set_log_level(logging.WARNING, update_existing=False) == logging.ERROR
    assert gc.get_logger("t2").level == logging.ERROR       # not updated
    gc.enable_debug_log()
    assert gc.get_logger("t2").level == logging.DEBUG and gc.get_logger().level == logging.DEBUG
    buf = io.StringIO()
    gc.set_log_file(buf)
    gc.get_logger("gradcore.t1").warning("once only")
    assert buf.getvalue().count("once only") == 1          # the child propagates to gradcore's copy
    path = tmp_path / "run.log"
    gc.set_log_file(str(path))
    gc.get_logger("t2").info("to the file")
    gc.set_log_file(io.StringIO())                         # closes the file it opened
    assert "to the file" in path.read_text() and "to the file" not in buf.getvalue()
    with pytest.raises(TypeError, match="set_log_file"):
        gc.set_log_file(3)
    gc.set_log_level(old)


def test_get_logger_formatter():
    class Marked(logging.Formatter):
        def format(self, record):
            return "MARK " + super().format(record)
    lg = gc.get_logger("gradcore.formatted_test", Marked)
    handlers = [h for h in lg.handlers if isinstance(h.formatter, Marked)]
    assert len(handlers) == 1
    gc.get_logger("gradcore.formatted_test", Marked)
    assert len([h for h in lg.handlers if isinstance(h.formatter, Marked)]) == 1
    lg.removeHandler(handlers[0])


@pytest.fixture
def restore_config():
    saved = dict(gc.config._state)
    yield gc.config
    gc.config._state.update(saved)


def test_config_switches(restore_config):
    cfg = restore_config
    assert cfg.async_level == 2 and cfg.benchmark_kernel is False and cfg.deterministic_kernel is False
    for name in ("benchmark_kernel", "deterministic_kernel", "benchmark_with_subprocess", "disable_memory_forwarding"):
        setattr(cfg, name, True)
        assert getattr(cfg, name) is True
        with pytest.raises(TypeError, match=f"config.{name}"):
            setattr(cfg, name, 1)
    cfg.async_level = 0
    assert cfg.async_level == 0
    for bad in (3, -1, True, "1"):
        with pytest.raises(ValueError, match="async_level"):
            cfg.async_level = bad


def test_config_and_execution_strategy_are_one_switch(restore_config, restore_strategy):
    dp = restore_strategy
    restore_config.benchmark_kernel, restore_config.deterministic_kernel = True, True
    assert dp.get_execution_strategy() == dp.Strategy.PROFILE | dp.Strategy.REPRODUCIBLE
    dp.set_execution_strategy("HEURISTIC")
    assert restore_config.benchmark_kernel is False and restore_config.deterministic_kernel is False


def test_resize_layer_matches_torch_bilinear():
    import numpy as np
    import gradcore.module as M
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 7))
    for imode, tmode in (("linear", "bilinear"), ("nearest", "nearest")):
        got = M.Resize([3, 4], imode=imode)(gc.tensor(x)).numpy()
        want = torch.nn.functional.interpolate(torch.tensor(x), (3, 4), mode=tmode,
                                               **({"align_corners": False} if tmode == "bilinear" else {})).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=imode)
    # F.vision.resize takes MegEngine's op names of the modes as well
    np.testing.assert_array_equal(F.vision.resize(gc.tensor(x), (3, 4), imode="linear").numpy(),
                                  F.vision.resize(gc.tensor(x), (3, 4), imode="bilinear").numpy())
    assert M.Resize(gc.tensor([2, 3]))(gc.tensor(x)).shape == (2, 3, 2, 3)
    with pytest.raises(ValueError, match="Resize: format"):
        M.Resize([2, 2], format="NCDHW")


def test_remap_layer_is_f_remap_of_the_stacked_maps():
    import numpy as np
    import gradcore.module as M
    rng = np.random.default_rng(1)
    inp = gc.tensor(rng.standard_normal((2, 3, 4, 5)))
    mx, my = rng.uniform(-1, 5, (2, 3, 6)), rng.uniform(-1, 4, (2, 3, 6))
    got = M.Remap()(inp, gc.tensor(mx), gc.tensor(my), "linear", "constant", 0.5).numpy()
    want = F.vision.remap(inp, gc.tensor(np.stack([mx, my], -1)), "constant", 0.5, "linear").numpy()
    np.testing.assert_array_equal(got, want)
    both = gc.tensor(np.stack([mx, my], -1))
    np.testing.assert_array_equal(M.Remap()(inp, both, gc.tensor(np.zeros((0,)))).numpy(),
                                  F.vision.remap(inp, both).numpy())
    with pytest.raises(ValueError, match="Remap: map_1.*map_2"):
        M.Remap()(inp, gc.tensor(mx), gc.tensor(my[:, :2]))


def test_tensor_takes_megengines_parameters_in_megengines_order():
    import numpy as np
    # Tensor(data, dtype, device, is_const, no_cache, name, format)
    t = gc.Tensor([1, 2], "float32", "cpu", True, True, "w", "default")
    assert t.dtype == np.float32 and t.device == "cpu" and t.name == "w"
    assert gc.Tensor([1.0], None, None, True).name == ""          # the 4th is is_const, not the name
    p = gc.Parameter([1.0], name="p", is_const=False, no_cache=False, format="default")
    assert p.name == "p" and isinstance(p, gc.Parameter)
    with pytest.raises(ValueError, match="Tensor: format must be 'default'.*'nhwc'"):
        gc.Tensor([1.0], format="nhwc")


def test_megengine_functional_module_paths():
    # MegEngine's F.math.<name> / F.tensor.<name> (and `from megengine.functional.math import ...`)
    import gradcore.functional as F
    from gradcore.functional import math as fmath, tensor as ftensor
    for mod in (fmath, ftensor):
        assert mod.__all__, mod
        for name in mod.__all__:
            assert getattr(mod, name) is getattr(F, name), f"{mod.__name__}.{name}"
    assert {"argmax", "topk", "svd", "normalize"} <= set(fmath.__all__)
    assert {"concat", "cond_take", "meshgrid", "zeros_like"} <= set(ftensor.__all__)
