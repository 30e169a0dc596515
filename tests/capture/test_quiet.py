"""Library output is silenced inside zrt's capture and restored on exit (stderr carries only
zrt's own line)."""

from __future__ import annotations

import logging
import warnings

from transformers.utils import logging as hf_logging

from zrt_core.capture.api import QUIET_LOGGERS, _quiet_libraries


def test_library_warnings_and_logs_are_silenced_inside_and_restored_after(capsys):
    hf_logging.set_verbosity_warning()
    torch_log = logging.getLogger("torch")
    torch_level = torch_log.level
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        filters = list(warnings.filters)
        with _quiet_libraries():
            warnings.warn("a deprecation from a library", FutureWarning, stacklevel=1)
            hf_logging.get_logger("transformers.configuration_utils").warning("a config warning")
            for name in QUIET_LOGGERS:
                logging.getLogger(name).warning("a library log line")
        assert warnings.filters == filters
    captured = capsys.readouterr()
    assert (captured.out, captured.err, escaped) == ("", "", [])
    assert hf_logging.get_verbosity() == hf_logging.WARNING
    assert torch_log.level == torch_level


def test_a_warning_outside_the_capture_still_reaches_the_caller():
    with _quiet_libraries():
        pass
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.warn("the caller's own", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["the caller's own"]
