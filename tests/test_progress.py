"""Progress of a slow build (smelt/progress.py): log lines past a few seconds, a bar on a terminal."""
import io
import logging

import pytest
import torch

from smelt import progress

pytestmark = pytest.mark.cpu_backend_independent


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_fast_build_says_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="smelt"):
        p = progress.Progress("graph 0 (inference)", 3, bar=True, stream=Terminal())
        for _ in range(3):
            p.step()
        p.close()
    assert caplog.text == "" and p.stream.getvalue() == ""


def test_a_slow_build_logs_and_draws_its_bar(caplog, monkeypatch):
    monkeypatch.setattr(progress, "SLOW_SECONDS", 0.0)
    stream = Terminal()
    with caplog.at_level(logging.INFO, logger="smelt"):
        p = progress.Progress("graph 3 (forward)", 4, bar=True, stream=stream)
        for _ in range(4):
            p.step()
        p.close()
    assert "graph 3 (forward): 1 of 4 kernels built" in caplog.text
    assert "all 4 kernels built" in caplog.text
    drawn = stream.getvalue()
    assert "[" + "#" * progress.BAR_WIDTH + "] 4/4 kernels" in drawn and drawn.endswith("\r\033[K")


def test_no_bar_off_a_terminal(monkeypatch):
    monkeypatch.setattr(progress, "SLOW_SECONDS", 0.0)
    stream = io.StringIO()
    p = progress.Progress("graph 0 (inference)", 2, bar=True, stream=stream)
    p.step()
    p.close()
    assert stream.getvalue() == ""


@pytest.mark.smelt_only
def test_a_compile_reports_its_kernels(caplog, monkeypatch):
    monkeypatch.setattr(progress, "SLOW_SECONDS", 0.0)
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="smelt"):
        x = torch.randn(50)
        torch.testing.assert_close(torch.compile(lambda x: x.sin().sum() + x.cos().amax(), backend="smelt")(x),
                                   x.sin().sum() + x.cos().amax())
    assert "kernels built" in caplog.text
