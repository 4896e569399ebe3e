"""A small hand-made run's protocol and outputs (three requests, one failed; one split step),
shared by the result-schema tests and the shared-results-directory tests."""

from pytest_afd.core.backend import RequestOutput, RunOutputs

PROTOCOL = {"seed": 0, "warmups": 1, "repetitions": 3, "run_order": "interleaved",
            "instrumented": False, "routing": "natural"}


def make_outputs(wall=0.5):
    steps = [{"policy": "token_balanced", "split_token": 80, "imbalance": 0.0,
              "ubatches": [{"num_real_tokens": 80, "num_padded_tokens": 0},
                           {"num_real_tokens": 80, "num_padded_tokens": 16}]}]
    requests = [RequestOutput("a", 100, 20, 5, ttft_s=0.1), RequestOutput("b", 60, 0, 3, ttft_s=0.2),
                RequestOutput("c", 40, 0, 0, error="boom")]
    return RunOutputs(requests=requests, steps=steps, expert_load=[[1, 2, 3, 4, 5, 6, 7, 8]],
                      wall_time_s=wall)
