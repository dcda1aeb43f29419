"""Prompt-lookup speculation on an editing task: the model rewrites a ~300-token function
with one identifier renamed, greedy, plain and with speculative="ngram" in alternating
runs; generation tokens/s of each (ranges over the runs), their ratio, the share of
drafts accepted, and whether both produced the same tokens (they must).

    PYTHONPATH=. python benchmarks/speculative.py [--model smollm2-135m] [--threads 2]
                                                  [--repeat 3] [--tokens 400] [--draft-max 16]
                                                  [--draft-model NAME|PATH]

With --draft-model, a third run per round drafts with that model (speculative="draft").
"""

from __future__ import annotations

import argparse
import json

FUNCTION = '''def summarize_orders(orders, tax_rate=0.2, currency="EUR"):
    """Totals, averages and the largest order per customer."""
    per_customer = {}
    for order in orders:
        customer = order["customer"]
        amount = order["amount"] * (1 + tax_rate)
        entry = per_customer.setdefault(customer, {"count": 0, "total": 0.0, "largest": 0.0})
        entry["count"] += 1
        entry["total"] += amount
        if amount > entry["largest"]:
            entry["largest"] = amount
    report = []
    for customer, entry in sorted(per_customer.items()):
        average = entry["total"] / entry["count"]
        report.append({
            "customer": customer,
            "orders": entry["count"],
            "total": round(entry["total"], 2),
            "average": round(average, 2),
            "largest": round(entry["largest"], 2),
            "currency": currency,
        })
    grand_total = sum(item["total"] for item in report)
    return {"customers": report, "grand_total": round(grand_total, 2), "currency": currency}
'''
INSTRUCTION = ("Rename the variable `entry` to `stats` in this Python function. Reply with the whole "
               "function and nothing else.\n\n```python\n" + FUNCTION + "```")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--draft-max", type=int, default=16)
    parser.add_argument("--draft-model", default=None)
    args = parser.parse_args()

    from pyengine import LLM
    from pyengine.session import prepare_chat

    llm = LLM(args.model, n_ctx=2048, n_threads=args.threads, n_parallel=1, draft_model=args.draft_model)
    prepared = prepare_chat(llm, [{"role": "user", "content": INSTRUCTION}])
    modes = ["off", "ngram"] + (["draft"] if args.draft_model else [])
    speeds: dict[str, list[float]] = {m: [] for m in modes}
    acceptance: dict[str, list[float]] = {m: [] for m in modes}
    outputs: dict[str, list[int]] = {}
    for rep in range(args.repeat + 1):   # the first round warms graphs and pages
        for mode in modes:
            result = llm.submit(prepared.ids, max_tokens=args.tokens, temperature=0.0, repeat_penalty=1.0,
                                stop=list(prepared.stops) or None, speculative=mode, draft_max=args.draft_max,
                                cache_prompt=False).result()
            outputs.setdefault(mode, result.tokens)
            if result.tokens != outputs[mode] or result.tokens != outputs["off"]:
                raise SystemExit(f"{mode}: the tokens differ from the plain run's")
            if rep:
                speeds[mode].append((len(result.tokens) - 1) / result.generation_seconds)
                acceptance[mode].append(result.draft_acceptance)
    plain = speeds["off"]
    report = {"model": str(llm.path.name), "threads": llm.n_threads, "generated": len(outputs["off"]),
              "prompt_tokens": len(prepared.ids), "identical": True}
    for mode in modes:
        tps = speeds[mode]
        report[mode] = {"tok_s_min": min(tps), "tok_s_max": max(tps),
                        "ratio_per_pair": [round(s / p, 2) for s, p in zip(tps, plain)],
                        "acceptance": round(max(acceptance[mode]), 3)}
    print(json.dumps(report, indent=2))
    llm.close()


if __name__ == "__main__":
    main()
