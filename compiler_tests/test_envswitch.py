"""pedsl's on/off environment switches (pedsl/envswitch.py): the usual spellings in any case and spacing,
every other value refused by name (exit 2 from the CLI, never a traceback), and each switch read through
the one parser (a value that used to count as set, like PEDSL_DEBUG=0, now means off)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from compiler_helpers import ROOT

from pedsl import envswitch
from pedsl.envswitch import SWITCHES, SwitchError, parse

ON = ["1", "true", "True", "ON", "yes", " Yes ", "01"]
OFF = ["0", "false", "FALSE", "off", "Off", "no", "00", " 0", "0 "]
BAD = ["2", "maybe", "o", "nope", "enable", "-1", "1.0", "0x0", "tru", "0 1"]


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_each_switch_reads_the_usual_spellings(name):
    for value in ON:
        assert parse(name, value) is True, value
    for value in OFF:
        assert parse(name, value) is False, value
    for value in (None, "", "  "):
        assert parse(name, value) is SWITCHES[name].default


@pytest.mark.parametrize("value", BAD)
def test_any_other_value_is_refused_by_name(value):
    with pytest.raises(SwitchError) as err:
        parse("PEDSL_CPU_KERNELS", value)
    assert err.value.code == "E995" and err.value.exit_code == 2
    assert "PEDSL_CPU_KERNELS" in str(err.value) and repr(value) in str(err.value)
    assert "false" in err.value.hint and "yes" in err.value.hint


def test_no_module_reads_a_switch_but_through_the_parser():
    """Every PEDSL_* variable that is a switch is read by pedsl.envswitch: no ``os.environ`` test of one
    anywhere else in pedsl/ (where a string's truth would make "0" mean on)."""
    offenders = []
    for path in (ROOT / "pedsl").rglob("*.py"):
        if path.name == "envswitch.py":
            continue
        text = path.read_text(encoding="utf-8")
        offenders += [f"{path.relative_to(ROOT)}: {name}" for name in SWITCHES if f'environ.get("{name}"' in text
                      or f"environ['{name}']" in text or f'environ["{name}"]' in text]
    assert not offenders


def _cli(args, **env):
    full = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    full.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "pedsl", *args], capture_output=True, text=True, env=full,
                          timeout=120, cwd=ROOT, check=False)


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_the_cli_refuses_a_bad_switch_before_any_command(name):
    """Exit 2 with the one-paragraph diagnostic naming the variable and its value, even for a command that
    does not read that switch (a typo is caught at once), and no traceback."""
    proc = _cli(["list"], **{name: "nope"})
    assert proc.returncode == 2, proc.stderr
    assert f"{name}='nope'" in proc.stderr and "E995" in proc.stderr and "Traceback" not in proc.stderr
    assert _cli(["list"], **{name: " Off"}).returncode == 0


def test_pedsl_no_cache_off_keeps_the_cache(monkeypatch, tmp_path):
    """PEDSL_NO_CACHE=0 (and false) keeps the parser's table cache; before the one parser any value, "0"
    included, turned it off."""
    from pedsl.lang import grammar

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for off in ("0", "false"):
        monkeypatch.setenv("PEDSL_NO_CACHE", off)
        assert grammar._cache_file("pe.lark") is not None
    monkeypatch.setenv("PEDSL_NO_CACHE", "yes")
    assert grammar._cache_file("pe.lark") is None
    monkeypatch.setenv("PEDSL_NO_CACHE", "sometimes")
    with pytest.raises(SwitchError, match="PEDSL_NO_CACHE"):
        grammar._cache_file("pe.lark")


def test_check_all_names_the_first_bad_switch(monkeypatch):
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
    envswitch.check_all()
    monkeypatch.setenv("PEDSL_DEBUG", "verbose")
    with pytest.raises(SwitchError, match="PEDSL_DEBUG='verbose'"):
        envswitch.check_all()
    assert envswitch.switch_or_default("PEDSL_DEBUG") is False
