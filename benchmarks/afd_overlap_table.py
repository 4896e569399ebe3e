"""The AFD overlap benchmark's text summary: one table per model, ratios, targets."""

from __future__ import annotations

NOISE_MARK = "~"  # a ratio inside the measured noise floor


def _case_line(workload: str, policy: str, case: dict) -> str:
    inst = case["instrumented"] or {}
    imbalance = "-" if case["imbalance"] is None else f"{case['imbalance']:.2f}"
    step = case["step_time_s"]
    cpu = case["cpu_time_s"]
    attention = cpu["Attention rank 0"]["median"]
    ffn = sum(v["median"] for k, v in cpu.items() if k.startswith("FFN"))
    bubble = inst.get("exposed_bubble_s")
    return (
        f"{workload:11} {policy:22} {case['split_token'] or '-':>5} {imbalance:>6} "
        f"{step['median']:8.3f} {step['rel_iqr'] or 0:6.2f} {attention:7.3f} {ffn:7.3f} "
        f"{case['attention_cpu_share']:6.2f} "
        f"{'-' if bubble is None else f'{bubble:.3f}':>7}"
    )


def _ratio_line(name: str, ratio: dict) -> str:
    mark = NOISE_MARK if ratio["inside_noise_floor"] else " "
    low, high = ratio["ci95"]
    step = ratio.get("modelled_step")
    replay = ratio.get("cpu_replay")
    same = "  identical plans" if ratio["identical_plans"] else ""
    return (
        f"{'':11} {mark} {name:44} {ratio['median']:.3f} [{low:.3f}, {high:.3f}]"
        f"  cpu {ratio['attention_cpu_ratio']:.3f}  model {ratio['modelled']:.3f}"
        f" / {'-' if step is None else f'{step:.3f}'}"
        f"  replay {'-' if replay is None else f'{replay:.3f}'}{same}"
    )


def print_summary(result: dict) -> None:
    host = result["host"]
    before, after = host["loadavg_before"], host["loadavg_after"]
    print(
        f"afd_overlap_bench: {result['repetitions']} interleaved rounds (min of "
        f"{result['steps_per_case']} steps per case each), {host['cpus']} CPUs, "
        f"rank niceness {result['rank_nice']}, "
        f"load {before[0]:.2f} before / {after[0]:.2f} after, {result['wall_s']:.0f}s"
    )
    for model_name, model in result["models"].items():
        floor = model["noise_floor"]
        loads = model["loadavg_per_round"]
        print(
            f"\n== {model_name} (moe_intermediate_size {model['config']['moe_intermediate_size']},"
            f" startup {model['startup_s']:.1f}s, noise floor "
            f"{'-' if floor is None else f'±{100 * floor:.1f}%'}, load per round "
            f"{min(loads):.2f}-{max(loads):.2f})"
        )
        print(
            f"{'workload':11} {'policy':22} {'cut':>5} {'imbal':>6} {'step med':>8} {'rIQR':>6} "
            f"{'attnCPU':>7} {'ffnCPU':>7} {'share':>6} {'bubble':>7}"
        )
        for workload, entry in model["workloads"].items():
            for policy, case in entry["policies"].items():
                print(_case_line(workload, policy, case))
            for name, ratio in entry["ratios"].items():
                print(_ratio_line(name, ratio))
    print(f"\n({NOISE_MARK}: inside the noise floor or the 95% interval holds 1.0; "
          "ratio = median of per-round ratios [bootstrap 95% interval]; "
          "cpu = the same ratio of Attention-rank CPU time; model = the fitted cost model's "
          "MoE-layer makespans / plus the measured whole-batch CPU time on both sides; "
          "replay = the instrumented steps replayed on thread-CPU span times)")
    print("targets:")
    for target in result["targets"]:
        value = target["value"]
        shown = "-" if value is None else f"{value:.3f}"
        extra = f" ci95 [{target['ci95'][0]:.3f}, {target['ci95'][1]:.3f}]" if "ci95" in target else ""
        verdict = "MET" if target["met"] else "NOT MET"
        print(f"  {verdict:8} {target['name']}: {shown}{extra} ({target.get('threshold', target.get('why'))})")
