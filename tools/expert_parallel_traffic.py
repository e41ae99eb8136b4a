#!/usr/bin/env python3
"""Per-token traffic of expert parallelism (src/dist, `mpirun -np N ds41 ...`) for a checkpoint
config, and what it costs on a link of a given speed beside each rank's memory roofline.

The message layout is dist/mpi_job.cpp's: per MoE layer, rank 0 sends each follower that owns at
least one of the token's experts one message (a 40-byte header, 12 bytes per expert, 8 more, 8 per
row, and the token's hidden row once: 2 * dim bytes) and receives one 2 * dim-byte row per expert
that follower computed. With routing uniform over the experts (experts in contiguous blocks of
E / N per rank), a follower is hit with probability 1 - C(E - E/N, k) / C(E, k).

`--check-bench FILE` compares the formula with a `ds41 bench --json` run under mpirun (its
expert_parallel.per_rank bytes) for the config the run used (--config).

Usage: expert_parallel_traffic.py --config config.json [--ranks 2,4,8] [--links 25,100,200]
         [--triad-gbs 200] [--dense-gb 8.5] [--expert-gb 4.5] [--latency-us 20] [--check-bench FILE]
"""
import argparse
import json
import math


def model_shape(path):
    """(dim, routed experts, activated experts, MoE layers) from a released-layout config.json
    (text_config) or a flat inference config."""
    c = json.load(open(path))
    if "text_config" in c:
        t = c["text_config"]
        return t["hidden_size"], t["n_routed_experts"], t["num_experts_per_tok"], t["num_hidden_layers"]
    return c["dim"], c["n_routed_experts"], c["n_activated_experts"], c["n_layers"]


def expected_traffic(dim, experts, k, ranks, layers):
    """(bytes rank 0 sends, bytes it receives) per decoded token, summed over its followers."""
    per_rank = experts / ranks
    p_hit = 1.0 - math.comb(experts - int(per_rank), k) / math.comb(experts, k)
    rows_per_follower = k * per_rank / experts  # expected expert rows one follower computes
    experts_per_follower = rows_per_follower  # one row per expert for one token
    sent = (ranks - 1) * (p_hit * (40 + 8 + 2 * dim) + 12 * experts_per_follower + 8 * rows_per_follower)
    received = (ranks - 1) * rows_per_follower * 2 * dim
    return sent * layers, received * layers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--links", default="25,100,200", help="link speeds in Gb/s")
    ap.add_argument("--triad-gbs", type=float, default=200.0, help="each rank's memory bandwidth, GB/s")
    ap.add_argument("--dense-gb", type=float, default=8.5, help="dense bytes rank 0 reads per token, GB")
    ap.add_argument("--expert-gb", type=float, default=4.5, help="routed-expert bytes a token reads, GB")
    ap.add_argument("--latency-us", type=float, default=20.0, help="one message round trip, microseconds")
    ap.add_argument("--check-bench")
    a = ap.parse_args()
    dim, experts, k, layers = model_shape(a.config)
    if a.check_bench:
        b = json.load(open(a.check_bench))
        n = b["ranks"]
        sent, received = expected_traffic(dim, experts, k, n, layers)
        r0 = b["expert_parallel"]["per_rank"][0]
        print(f"{a.check_bench}: {n} ranks: rank 0 sent {r0['bytes_sent_per_token']:.0f} B/token (formula {sent:.0f}), "
              f"received {r0['bytes_received_per_token']:.0f} (formula {received:.0f})")
        return
    print(f"dim {dim}, {layers} MoE layers, top-{k} of {experts} experts; rank 0 reads {a.dense_gb} GB dense + "
          f"{a.expert_gb} GB / N of experts per token at {a.triad_gbs} GB/s; {a.latency_us} us per round trip")
    print("| ranks | rank 0 sends / receives per token | link | link time per token | decode roofline | one machine |")
    print("|---|---|---|---|---|---|")
    one = 1.0 / ((a.dense_gb + a.expert_gb) / a.triad_gbs)
    for n in [int(x) for x in a.ranks.split(",")]:
        sent, received = expected_traffic(dim, experts, k, n, layers)
        for gbit in [float(x) for x in a.links.split(",")]:
            link_bytes_per_s = gbit * 1e9 / 8
            # Full duplex: the larger direction sets the time; one round trip per layer.
            link_s = max(sent, received) / link_bytes_per_s + layers * a.latency_us * 1e-6
            memory_s = (a.dense_gb + a.expert_gb / n) / a.triad_gbs
            print(f"| {n} | {sent / 1e6:.2f} / {received / 1e6:.2f} MB | {gbit:.0f} Gb/s | {link_s * 1e3:.2f} ms | "
                  f"{1.0 / (memory_s + link_s):.1f} tok/s | {one:.1f} tok/s |")


if __name__ == "__main__":
    main()
