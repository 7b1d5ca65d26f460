#!/usr/bin/env python3
"""Uploads a TorchScript model to mutwo-server, submits a job, waits for it
and prints the schedule for every batch size and budget.

    client/python/example.py --server=127.0.0.1:50051 --model=model.pt \\
        --input='x:float32[B,3,32,32]' --batch=8,16 --budget=60% --budget=2GiB

It uses the `mutwo` package next to it (client/python/mutwo; or installed
with pip, client/python/README.md). Exit codes (as the mutwo CLI): 0 the job succeeded (or was submitted, with
--no_wait), 1 the job failed or was cancelled, 2 bad input, 4 the server is
unavailable or the wait timed out.
"""

import argparse
import os
import sys
import uuid

import grpc

import mutwo
from mutwo.v1 import types_pb2

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_UNAVAILABLE = 0, 1, 2, 4


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="127.0.0.1:50051", help="HOST:PORT")
    p.add_argument("--model", required=True, help="TorchScript file (.pt)")
    p.add_argument("--name", default="", help="display name / metrics label "
                   "(default: the file name)")
    p.add_argument("--input", action="append", required=True,
                   help="input spec, repeatable: x:float32[B,3,224,224]")
    p.add_argument("--batch", required=True, help="batch sizes: 8,16,32")
    p.add_argument("--budget", action="append", default=[],
                   help="memory budget, repeatable: 60%%, 80%%dev, 4GiB")
    p.add_argument("--loss", default="mean",
                   help="mean, sum, model or cross_entropy:y:int64[B]{0,10}")
    p.add_argument("--optimizer", default="sgd", help="sgd, adam:lr=0.01, ...")
    p.add_argument("--device_kind", default="", choices=["", "cpu", "cuda"])
    p.add_argument("--request_id", default="",
                   help="idempotency key (default: a fresh one)")
    p.add_argument("--token_file", default=None,
                   help="file whose first line is your bearer token (else "
                   "MUTWO_TOKEN_FILE, else MUTWO_TOKEN)")
    p.add_argument("--tls_ca", default=None,
                   help="PEM CA of the server's certificate: connect with TLS "
                   "(else MUTWO_TLS_CA)")
    p.add_argument("--timeout_s", type=float, default=30.0,
                   help="deadline of each unary RPC")
    p.add_argument("--wait_timeout_s", type=float, default=3600.0)
    p.add_argument("--no_wait", action="store_true",
                   help="print the submitted job and the workers, then exit")
    return p.parse_args(argv)


def print_job(job):
    """Prints a mutwo.Job from its message (job.proto)."""
    job = job.proto
    spec = job.spec
    print("job %s: %s (%d/%d tasks)%s" % (
        job.job_id, types_pb2.Job.State.Name(job.state), job.tasks_done,
        job.tasks_total, ": " + job.error if job.error else ""))
    print("  model %s (%s), batch sizes %s" % (
        spec.model_name or "unnamed", spec.model_sha256[:12],
        ",".join(str(b) for b in spec.batch_sizes)))
    for r in job.results:
        if r.oom or r.error:
            print("  batch %d: %s" % (r.batch_size,
                                      "out of memory" if r.oom else r.error))
            continue
        print("  batch %d: baseline peak %s, %.2f ms/iteration" % (
            r.batch_size, mutwo.format_bytes(r.baseline_peak_bytes),
            r.baseline_iteration_ms))
        # A validation proves one schedule: the one planned for its budget
        # (the last round's, when the server re-planned it).
        by_budget = {v.budget_bytes: v for v in r.validations}
        # Whether each budget is proved to fit (same order as schedules).
        outcomes = list(r.outcomes)
        for i, s in enumerate(r.schedules):
            print("    budget %-8s %s: %s" % (
                s.budget.text or mutwo.format_bytes(s.budget_bytes),
                types_pb2.Policy.Name(s.policy),
                "predicted peak %s (%d recomputed, %d swapped), %.2f ms" % (
                    mutwo.format_bytes(s.predicted_peak_bytes), s.recomputed,
                    s.swapped, s.predicted_iteration_ms)
                if s.feasible else "infeasible: " + s.reason))
            for d in s.decisions if s.feasible else ():
                if d.action != types_pb2.Decision.RETAIN:
                    print("      %-9s value %d (node %d, %s)" % (
                        types_pb2.Decision.Action.Name(d.action),
                        d.value_id, d.producer_node,
                        mutwo.format_bytes(d.size_bytes)))
            v = by_budget.get(s.budget_bytes) if s.feasible else None
            if v is not None:
                print("      measured: peak %s, %.2f ms, within budget: %s, "
                      "gradients match: %s%s" % (
                          mutwo.format_bytes(v.scheduled.peak_bytes),
                          v.scheduled.iteration_ms,
                          "yes" if v.within_budget else "no",
                          "yes" if v.gradients_match else "no",
                          ", error: " + v.error if v.error else ""))
            if i < len(outcomes):
                o = outcomes[i]
                print("      fits: %s" % (
                    "yes, after %d round(s)" % o.rounds if o.fits else
                    "no (%s)%s" % (
                        types_pb2.BudgetOutcome.State.Name(o.state),
                        ": " + o.reason if o.reason else "")))
    if job.HasField("max_batch") and job.max_batch.capacity_bytes > 0:
        m = job.max_batch
        print("  max batch on %s: %d without checkpointing, %d with a "
              "schedule" % (mutwo.format_bytes(m.capacity_bytes),
                            m.max_batch_without_checkpointing,
                            m.max_batch_with_schedule))


def main(argv):
    args = parse_args(argv)
    try:
        batch_sizes = [int(b) for b in args.batch.split(",")]
        if any(b <= 0 for b in batch_sizes):
            raise ValueError
    except ValueError:
        print('example: --batch "%s": expected positive integers like 8,16'
              % args.batch, file=sys.stderr)
        return EXIT_BAD_INPUT
    if not os.path.isfile(args.model):
        print("example: --model %s: no such file" % args.model,
              file=sys.stderr)
        return EXIT_BAD_INPUT

    try:
        client = mutwo.Client(args.server, timeout_s=args.timeout_s,
                              token_file=args.token_file, tls_ca=args.tls_ca)
    except ValueError as e:
        print("example: %s" % e, file=sys.stderr)
        return EXIT_BAD_INPUT
    with client:
        try:
            uploaded = client.upload(
                args.model, name=args.name or os.path.basename(args.model))
        except mutwo.MutwoError as e:
            return rpc_failure(e)
        print("uploaded %s (%s, %s)" % (
            uploaded.sha256[:12], mutwo.format_bytes(uploaded.size_bytes),
            "already stored" if uploaded.already_stored else "new"))
        try:
            job = client.submit(
                uploaded, inputs=args.input, batch_sizes=batch_sizes,
                budgets=args.budget, loss=args.loss, optimizer=args.optimizer,
                device_kind=args.device_kind,
                client_request_id=args.request_id or uuid.uuid4().hex)
        except ValueError as e:
            print("example: %s" % e, file=sys.stderr)
            return EXIT_BAD_INPUT
        except mutwo.MutwoError as e:
            return rpc_failure(e)
        print("submitted job %s" % job.job_id)
        if args.no_wait:
            try:
                print_job(client.job(job))
                workers = client.workers()
            except mutwo.MutwoError as e:
                return rpc_failure(e)
            print("%d worker(s)" % len(workers))
            for w in workers:
                print("  %s %s %s %s" % (w.worker_id, w.hostname, w.device,
                                         w.state))
            return EXIT_OK
        try:
            # Progress on stderr, one line per change (tqdm if installed).
            final = client.wait(job, timeout_s=args.wait_timeout_s,
                                progress=True, raise_on_failure=False)
        except TimeoutError as e:
            print("example: %s" % e, file=sys.stderr)
            return EXIT_UNAVAILABLE
        except mutwo.MutwoError as e:
            return rpc_failure(e)
        print_job(final)
        return EXIT_OK if final.state == "SUCCEEDED" else EXIT_FAILED


def rpc_failure(error):
    print("example: %s" % error, file=sys.stderr)
    if error.code in (grpc.StatusCode.UNAVAILABLE,
                      grpc.StatusCode.DEADLINE_EXCEEDED):
        return EXIT_UNAVAILABLE
    if error.code in (grpc.StatusCode.INVALID_ARGUMENT,
                      grpc.StatusCode.NOT_FOUND):
        return EXIT_BAD_INPUT
    return EXIT_FAILED

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
