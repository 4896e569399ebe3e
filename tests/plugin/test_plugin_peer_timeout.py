"""``--afd-peer-timeout-s`` (issue 23, row 9): the CPU AFD runtime's peer timeout from the
CLI, ``$AFD_PEER_TIMEOUT_S`` or ini; a bad value is a usage error naming its source.

Each case is an in-process pytester session (``runpytest``, as the other plugin tests): it
loads the plugin, parses the options and builds the real CPU backend exactly as a new
process would, without a new interpreter importing torch per case. Nothing here changes
process-wide state (the backend's rank processes, which do, are never started)."""

import pytest

pytest_plugins = ["pytester"]

FAST = ("-p", "no:randomly", "-p", "no:cacheprovider", "-q")

# The real CPU backend (no fake conftest): the value must reach the runtime it starts.
USER = """
def test_reaches_the_backend(afd_options, afd_backend):
    assert afd_options.peer_timeout_s == {option}
    assert afd_backend.peer_timeout_s == {runtime}
"""


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("AFD_PEER_TIMEOUT_S", "AFD_BACKEND", "AFD_CPU_PROCESSES"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("args", "env", "option", "runtime"),
    [(["--afd-peer-timeout-s", "7"], {}, 7, 7), ([], {"AFD_PEER_TIMEOUT_S": "9"}, 9, 9),
     ([], {}, None, 120.0)],  # unset: the runtime's DEFAULT_PEER_TIMEOUT_S
    ids=["flag", "env", "default"],
)
def test_the_peer_timeout_reaches_the_cpu_backend(pytester, clean_env, monkeypatch, args, env,
                                                   option, runtime):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pytester.makepyfile(test_user=USER.format(option=option, runtime=runtime))
    result = pytester.runpytest(*FAST, *args)
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--afd-peer-timeout-s", "0"], {}, "--afd-peer-timeout-s=0: expected at least 1"),
        (["--afd-peer-timeout-s", "2.5"], {}, "--afd-peer-timeout-s='2.5': expected an integer"),
        ([], {"AFD_PEER_TIMEOUT_S": "100000"}, "$AFD_PEER_TIMEOUT_S=100000: expected at most 86400"),
        (["--afd-peer-timeout-s", "5", "--afd-backend", "vllm-ascend"], {},
         "--afd-peer-timeout-s=5: the peer timeout is the CPU AFD runtime's"),
    ],
)
def test_bad_peer_timeouts_are_usage_errors(pytester, clean_env, monkeypatch, args, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pytester.makepyfile(test_user="def test_never_runs():\n    raise AssertionError('ran')\n")
    result = pytester.runpytest(*FAST, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert message in result.stderr.str()
