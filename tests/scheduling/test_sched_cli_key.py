"""afd-chunk-plan explains its columns and every label it prints."""

from pytest_afd.scheduling import main


def test_a_sweep_explains_the_joint_candidate_it_names(capsys):
    assert main(["--prompt-len", "60000", "--num-requests", "4", "--cp", "8",
                 "--sweep", "8192,16384,32768,65536,unchunked"]) == 0
    out = capsys.readouterr().out
    assert "unchunked: JOINT candidate vs 65536" in out
    key = out[out.index("\nkey:\n"):]
    assert "  JOINT candidate: against the previous valid size this one changes the forwards" in key
    for column in ("effective", "forwards", "tails", "max rows/rank", "max rounds"):
        assert f"\n  {column}: " in key
    assert "crosses a comm-round boundary:" not in key  # only labels that were printed
