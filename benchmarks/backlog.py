#!/usr/bin/env python3
"""Durable-backlog benchmark: publish a large persistent backlog, crash the broker, time recovery.

For one broker (``--broker warren`` or ``--broker rabbitmq``) this starts a
throwaway node on a loopback port with its state in a fresh temp dir, then

1. declares ``--queues`` (1) durable queues (of ``--queue-type``: classic, quorum or stream), reads the broker's
   RSS (the empty node), and publishes ``--messages`` (1,000,000) persistent ``--size`` (100)
   byte messages spread evenly over them, with publisher confirms, pipelined with
   at most ``--max-unconfirmed`` (10,000) unconfirmed; reports the publish rate
   (messages / time until the last confirm);
2. sleeps ``--settle`` (5) s, then reads the broker's RSS from /proc (Warren: the
   python process; RabbitMQ: beam.smp), the growth per queued message over the
   empty node, and the disk use of its data dir;
3. stops the broker cleanly (SIGTERM), restarts it on the same data dir and
   measures the time from starting the process until passive queue.declares
   return message counts summing to N (polled every 0.1 s; the time until the
   AMQP port first accepts is reported too, and Warren's own "recovered N
   messages ... in X s" log line);
3b. kills the broker with SIGKILL and measures the restart the same way;
4. with ``--consume``: consumes and acks everything (prefetch 1000, multi-ack
   every 100), reports the rate, waits ``--compact-wait`` (10) s and reports the
   disk use again (compaction / garbage collection of the store).

The node is always stopped and its temp dir removed at the end (``--keep`` keeps
the dir).  Every phase is bounded by a timeout.  Output is a plain table, or
JSON with ``--json``.  The AMQP side is the raw-socket code of amqp_load.py.

    .venv/bin/python benchmarks/backlog.py --broker warren --messages 1000000
    .venv/bin/python benchmarks/backlog.py --broker rabbitmq --messages 1000000 --consume --json

RabbitMQ needs Debian/Ubuntu's rabbitmq-server package and must be run as root
or as the rabbitmq user (like run_rabbitmq.sh, whose environment it mirrors).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from amqp_load import AMQPError, Connection, consume_count, publish_confirmed  # noqa: E402 (after sys.path takes this folder)

QUEUE = "warren-bench.backlog"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def disk_usage(path: str) -> dict:
    """Allocated bytes (like du) and apparent bytes of everything under path."""
    alloc = apparent = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            alloc += st.st_blocks * 512
            apparent += st.st_size
    return {"allocated": alloc, "apparent": apparent}


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive for our purposes
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------------------
# brokers
# --------------------------------------------------------------------------

class Warren:
    name = "warren"
    default_port = 5698

    def __init__(self, port: int, tmp: str, python: str, log_level: str):
        self.port = port
        self.tmp = tmp
        self.data_dir = os.path.join(tmp, "data")
        self.python = python
        self.log_level = log_level
        self.log_path = os.path.join(tmp, "broker.log")
        self.proc: subprocess.Popen | None = None
        self._log_fh = None

    def start(self) -> None:
        self._log_fh = open(self.log_path, "ab")
        self._log_fh.write(f"---- start {time.strftime('%H:%M:%S')} ----\n".encode())
        self._log_fh.flush()
        # management HTTP is off: its fixed port (15672) may be taken by another node
        self.proc = subprocess.Popen(
            [self.python, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(self.port),
             "--data-dir", self.data_dir, "--log-level", self.log_level, "--mgmt-enabled", "false"],
            cwd=ROOT, stdout=self._log_fh, stderr=subprocess.STDOUT, start_new_session=True)

    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"warren exited (rc={self.proc.returncode if self.proc else None}); "
                               f"log tail:\n{self.log_tail()}")

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log_fh:
            self._log_fh.close()
            self._log_fh = None

    def log_tail(self, n: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                return "".join(fh.readlines()[-n:])
        except OSError:
            return ""

    def log_text(self) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                return fh.read()
        except OSError:
            return ""

    def recovery_log(self) -> str | None:
        # the console handler may wrap long lines, so match across whitespace
        found = re.findall(r"recovered\s+\d+\s+messages\s+in\s+\d+\s+durable\s+queues\s+in\s+[\d.]+s"
                           r"(?:\s+\([^)]*\))?", self.log_text())
        return " ".join(found[-1].split()) if found else None

    def problems(self) -> list[str]:
        return [ln.strip() for ln in self.log_text().splitlines()
                if re.search(r"ERROR|CRITICAL|Traceback|Exception", ln)]


class RabbitMQ:
    name = "rabbitmq"
    default_port = 5699

    def __init__(self, port: int, tmp: str, dist_port: int, node: str):
        self.port = port
        self.tmp = tmp
        self.node = node
        self.data_dir = os.path.join(tmp, "mnesia")
        self.log_dir = os.path.join(tmp, "log")
        self.pid_file = os.path.join(tmp, "rabbit.pid")
        os.makedirs(self.data_dir, exist_ok=True)
        os.makedirs(self.log_dir, exist_ok=True)
        plugins = os.path.join(tmp, "enabled_plugins")
        with open(plugins, "w") as fh:
            fh.write("[].\n")
        if os.getuid() == 0:  # the Debian wrapper su's to rabbitmq
            shutil.chown(tmp, "rabbitmq", "rabbitmq")
            for dirpath, dirs, files in os.walk(tmp):
                for x in dirs + files:
                    shutil.chown(os.path.join(dirpath, x), "rabbitmq", "rabbitmq")
        os.chmod(tmp, 0o755)
        self.env = dict(os.environ,
                        RABBITMQ_NODE_PORT=str(port), RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                        RABBITMQ_NODENAME=node, RABBITMQ_DIST_PORT=str(dist_port),
                        RABBITMQ_MNESIA_BASE=self.data_dir, RABBITMQ_LOG_BASE=self.log_dir,
                        RABBITMQ_PID_FILE=self.pid_file, RABBITMQ_ENABLED_PLUGINS_FILE=plugins,
                        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}")
        self._pid: int | None = None

    def start(self) -> None:
        self._pid = None
        try:
            os.unlink(self.pid_file)
        except FileNotFoundError:
            pass
        except PermissionError:
            pass
        # -detached returns before the node is up; readiness is polled by the caller
        subprocess.run(["rabbitmq-server", "-detached"], env=self.env, timeout=60, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def pid(self) -> int | None:
        """The beam.smp OS pid: from the pid file, else pgrep on the node name."""
        if self._pid and pid_alive(self._pid):
            return self._pid
        cands = []
        try:
            with open(self.pid_file) as fh:
                cands.append(int(fh.read().strip()))
        except (OSError, ValueError):
            pass
        try:
            out = subprocess.run(["pgrep", "-f", self.node], capture_output=True, text=True, timeout=10).stdout
            cands += [int(x) for x in out.split()]
        except (OSError, subprocess.TimeoutExpired):
            pass
        for pid in cands:
            try:
                with open(f"/proc/{pid}/comm") as fh:
                    if fh.read().strip() == "beam.smp" and pid_alive(pid):
                        self._pid = pid
                        return pid
            except OSError:
                continue
        return None

    def check_alive(self) -> None:
        pass  # -detached: nothing to wait on; the readiness poll times out instead

    def kill9(self) -> None:
        pid = self.pid()
        if pid is None:
            raise RuntimeError("cannot find the beam.smp pid to kill")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        # let epmd notice the node is gone before the restart registers it again
        deadline = time.monotonic() + 10
        while port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._pid = None

    def stop(self) -> None:
        pid = self.pid()
        if pid is None:
            return
        try:
            subprocess.run(["rabbitmqctl", "-n", self.node, "stop"], env=self.env, timeout=60,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 30
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)

    def log_text(self) -> str:
        out = []
        for f in sorted(os.listdir(self.log_dir)) if os.path.isdir(self.log_dir) else []:
            try:
                with open(os.path.join(self.log_dir, f), errors="replace") as fh:
                    out.append(fh.read())
            except OSError:
                pass
        return "".join(out)

    def log_tail(self, n: int = 30) -> str:
        return "".join(self.log_text().splitlines(True)[-n:])

    def recovery_log(self) -> str | None:
        return None

    def problems(self) -> list[str]:
        return [ln.strip() for ln in self.log_text().splitlines() if "[error]" in ln or "[critical]" in ln]


# --------------------------------------------------------------------------
# phases
# --------------------------------------------------------------------------

def wait_for_count(broker, args, queues: list[str], expected: int, t_start: float, timeout: float) -> dict:
    """Poll (every 0.1 s) until passive queue.declares return message counts summing
    to expected.  Times are relative to t_start (perf_counter at process start)."""
    deadline = time.monotonic() + timeout
    port_s = None
    conn = None
    last = None
    last_err = None
    first_count_s = None
    try:
        while time.monotonic() < deadline:
            broker.check_alive()
            if conn is None:
                try:
                    conn = Connection("127.0.0.1", args.port, args.user, args.password, args.vhost, timeout=10)
                    if port_s is None:
                        port_s = time.perf_counter() - t_start
                    conn.channel_open(1)
                except (OSError, AMQPError) as e:
                    last_err = f"{type(e).__name__}: {e}"
                    if conn is not None:
                        conn.close(0.5)
                    conn = None
                    time.sleep(0.1)
                    continue
            try:
                count = sum(conn.queue_declare(1, queue, durable=True, passive=True)[0] for queue in queues)
            except AMQPError as e:  # e.g. 404 while the queue is not recovered yet
                last_err = str(e)
                conn.close(0.5)
                conn = None
                time.sleep(0.1)
                continue
            except OSError as e:
                last_err = f"{type(e).__name__}: {e}"
                conn = None
                time.sleep(0.1)
                continue
            if first_count_s is None:
                first_count_s = time.perf_counter() - t_start
            last = count
            if count == expected:
                return {"ready_s": time.perf_counter() - t_start, "port_s": port_s,
                        "first_declare_s": first_count_s, "count": count}
            time.sleep(0.1)
    finally:
        if conn is not None:
            conn.close(1.0)
    raise RuntimeError(f"timeout after {timeout:.0f}s waiting for message_count == {expected} "
                       f"(last count {last}, last error {last_err}); log tail:\n{broker.log_tail()}")


def wait_port(broker, port: int, timeout: float) -> float:
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        broker.check_alive()
        try:
            c = Connection("127.0.0.1", port, "guest", "guest", "/", timeout=5)
            c.close(1.0)
            return time.perf_counter() - t0
        except (OSError, AMQPError):
            time.sleep(0.1)
    raise RuntimeError(f"{broker.name} did not accept AMQP connections within {timeout:.0f}s; "
                       f"log tail:\n{broker.log_tail()}")


def run(args) -> dict:
    res: dict = {"broker": args.broker, "port": args.port, "messages": args.messages, "size": args.size,
                 "max_unconfirmed": args.max_unconfirmed, "queues": args.queues, "queue_type": args.queue_type}
    queues = [QUEUE] if args.queues == 1 else [f"{QUEUE}.{i}" for i in range(args.queues)]
    if port_open(args.port):
        raise RuntimeError(f"port {args.port} is already in use")
    tmp = tempfile.mkdtemp(prefix=f"warren-backlog-{args.broker}.")
    res["tmp"] = tmp
    if args.broker == "warren":
        broker = Warren(args.port, tmp, args.python, args.log_level)
    else:
        broker = RabbitMQ(args.port, tmp, args.dist_port, args.node)
    try:
        # ---- start ----
        log(f"starting {args.broker} on 127.0.0.1:{args.port} (state in {tmp})")
        t0 = time.perf_counter()
        broker.start()
        wait_port(broker, args.port, args.start_timeout)
        res["cold_start_s"] = time.perf_counter() - t0
        log(f"up after {res['cold_start_s']:.1f}s")

        # ---- 1. publish ----
        conn = Connection("127.0.0.1", args.port, args.user, args.password, args.vhost, timeout=30)
        sp = conn.server_properties
        res["server"] = f"{sp.get('product')} {sp.get('version')}"
        conn.channel_open(1)
        queue_arguments = {"x-max-priority": args.max_priority} if args.max_priority is not None else None
        if args.queue_type != "classic":
            queue_arguments = {**(queue_arguments or {}), "x-queue-type": args.queue_type}
        for queue in queues:
            conn.queue_declare(1, queue, durable=True, arguments=queue_arguments)
        time.sleep(1)
        res["rss_empty_bytes"] = rss_bytes(broker.pid())
        conn.confirm_select(1)
        body = os.urandom(args.size // 2 + 1).hex()[: args.size].encode()
        log(f"publishing {args.messages:,} persistent {args.size}-byte messages "
            f"(<= {args.max_unconfirmed:,} unconfirmed)")
        t_pub = time.monotonic()

        def pub_progress(sent, confirmed):
            if time.monotonic() - pub_progress.last >= 10:
                pub_progress.last = time.monotonic()
                log(f"  sent {sent:,} confirmed {confirmed:,} "
                    f"({confirmed / (time.monotonic() - t_pub):,.0f}/s so far)")
        pub_progress.last = time.monotonic()
        confirmed_s = sent_s = 0.0
        nacks = 0
        for i, queue in enumerate(queues):
            share = args.messages // len(queues) + (1 if i < args.messages % len(queues) else 0)
            p = publish_confirmed(conn, queue, body, share, persistent=True,
                                  max_unconfirmed=args.max_unconfirmed, timeout=args.publish_timeout,
                                  progress=pub_progress, max_priority=args.max_priority)
            confirmed_s += p["confirmed_s"]
            sent_s += p["sent_s"]
            nacks += p["nacks"]
        res["publish_s"] = confirmed_s
        res["publish_rate"] = args.messages / confirmed_s
        res["publish_sent_s"] = sent_s
        res["nacks"] = nacks
        count = sum(conn.queue_declare(1, queue, durable=True, passive=True)[0] for queue in queues)
        res["count_after_publish"] = count
        conn.close()
        log(f"published in {confirmed_s:.1f}s = {res['publish_rate']:,.0f} msg/s "
            f"(nacks {nacks}, queue count {count:,})")

        # ---- 2. RSS and disk ----
        time.sleep(args.settle)
        pid = broker.pid()
        res["rss_bytes"] = rss_bytes(pid) if pid else None
        if res["rss_bytes"] and res["rss_empty_bytes"]:
            res["rss_per_message"] = (res["rss_bytes"] - res["rss_empty_bytes"]) / args.messages
        du = disk_usage(broker.data_dir)
        res["disk_bytes"] = du["allocated"]
        res["disk_apparent_bytes"] = du["apparent"]
        log(f"RSS {fmt_bytes(res['rss_bytes'])} (pid {pid}), data dir {fmt_bytes(du['allocated'])}")

        # ---- 3. clean stop + restart ----
        log(f"stopping {pid} (SIGTERM); restarting on the same data dir")
        broker.stop()
        t_restart = time.perf_counter()
        broker.start()
        r = wait_for_count(broker, args, queues, args.messages, t_restart, args.recovery_timeout)
        res["clean_restart_s"] = r["ready_s"]
        res["clean_restart_log"] = broker.recovery_log()
        log(f"counts back after a clean restart in {r['ready_s']:.2f}s")

        # ---- 3b. SIGKILL + restart ----
        pid = broker.pid()
        log(f"kill -9 {pid}; restarting on the same data dir")
        broker.kill9()
        t_restart = time.perf_counter()
        broker.start()
        r = wait_for_count(broker, args, queues, args.messages, t_restart, args.recovery_timeout)
        res["recovery_s"] = r["ready_s"]
        res["recovery_port_s"] = r["port_s"]
        res["recovery_first_declare_s"] = r["first_declare_s"]
        res["recovery_log"] = broker.recovery_log()
        pid = broker.pid()
        res["rss_after_recovery_bytes"] = rss_bytes(pid) if pid else None
        log(f"message_count == {args.messages:,} after {r['ready_s']:.2f}s "
            f"(port accepted at {r['port_s']:.2f}s)")
        if res["recovery_log"]:
            log(f"  log: {res['recovery_log']}")

        # ---- 4. consume ----
        if args.consume:
            conn = Connection("127.0.0.1", args.port, args.user, args.password, args.vhost, timeout=30)
            conn.channel_open(1)
            log(f"consuming {args.messages:,}")
            t_con = time.monotonic()

            def con_progress(got):
                if time.monotonic() - con_progress.last >= 10:
                    con_progress.last = time.monotonic()
                    log(f"  consumed {got:,} ({got / (time.monotonic() - t_con):,.0f}/s so far)")
            con_progress.last = time.monotonic()
            dt = 0.0
            for i, queue in enumerate(queues):
                share = args.messages // len(queues) + (1 if i < args.messages % len(queues) else 0)
                if i:  # a channel per queue: each keeps its consumer
                    conn.channel_open(i + 1)
                dt += consume_count(conn, i + 1, queue, share, timeout=args.consume_timeout, progress=con_progress,
                                    arguments={"x-stream-offset": "first"} if args.queue_type == "stream" else None)
            res["consume_s"] = dt
            res["consume_rate"] = args.messages / dt
            conn.close()  # also makes sure the last ack was processed before we look at counts
            conn = Connection("127.0.0.1", args.port, args.user, args.password, args.vhost, timeout=30)
            conn.channel_open(1)
            res["count_after_consume"] = sum(conn.queue_declare(1, queue, durable=True, passive=True)[0]
                                             for queue in queues)
            conn.close()
            log(f"consumed in {dt:.1f}s = {res['consume_rate']:,.0f} msg/s; "
                f"waiting {args.compact_wait:g}s for compaction")
            time.sleep(args.compact_wait)
            du = disk_usage(broker.data_dir)
            res["disk_after_consume_bytes"] = du["allocated"]
            res["disk_after_consume_apparent_bytes"] = du["apparent"]
            pid = broker.pid()
            res["rss_after_consume_bytes"] = rss_bytes(pid) if pid else None
            log(f"data dir after consume: {fmt_bytes(du['allocated'])}")
        res["broker_log_problems"] = broker.problems()[:20]
    finally:
        try:
            broker.stop()
        except Exception as e:  # never leave the node running silently
            log(f"warning: stopping {args.broker} failed: {e}")
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return res


def fmt_bytes(n) -> str:
    if n is None:
        return "n/a"
    return f"{n / 1e6:,.1f} MB"


def print_table(r: dict) -> None:
    def s(v, fmt="{:.2f} s"):
        return "n/a" if v is None else fmt.format(v)
    rows = [
        ("broker", f"{r['broker']} ({r.get('server')}) on 127.0.0.1:{r['port']}"),
        ("messages x size", f"{r['messages']:,} x {r['size']} B persistent in {r['queues']:,} queue(s), "
                            f"<= {r['max_unconfirmed']:,} unconfirmed"),
        ("cold start (empty)", s(r.get("cold_start_s"))),
        ("publish (all confirmed)", f"{r['publish_s']:.1f} s = {r['publish_rate']:,.0f} msg/s"
                                    f"  (nacks {r['nacks']}, queue count {r['count_after_publish']:,})"),
        ("RSS empty / after publish", f"{fmt_bytes(r.get('rss_empty_bytes'))} / {fmt_bytes(r.get('rss_bytes'))}"
                                      + (f" = {r['rss_per_message']:.1f} B per queued message"
                                         if r.get("rss_per_message") is not None else "")),
        ("data dir after publish",
         f"{fmt_bytes(r.get('disk_bytes'))} (apparent {fmt_bytes(r.get('disk_apparent_bytes'))})"),
        ("restart after SIGTERM", f"{s(r.get('clean_restart_s'))} until the counts sum to {r['messages']:,}"
                                  + (f"  ({r['clean_restart_log']})" if r.get("clean_restart_log") else "")),
        ("restart after kill -9", f"{s(r.get('recovery_s'))} until the counts sum to {r['messages']:,}"),
        ("  AMQP port accepted at", s(r.get("recovery_port_s"))),
        ("  first declare-ok at", s(r.get("recovery_first_declare_s"))),
        ("RSS after recovery", fmt_bytes(r.get("rss_after_recovery_bytes"))),
    ]
    if r.get("recovery_log"):
        rows.append(("  broker log", r["recovery_log"]))
    if "consume_rate" in r:
        rows += [
            ("consume + ack", f"{r['consume_s']:.1f} s = {r['consume_rate']:,.0f} msg/s"
                              f"  (queue count after {r['count_after_consume']:,})"),
            ("data dir after consume", f"{fmt_bytes(r.get('disk_after_consume_bytes'))} "
                                       f"(apparent {fmt_bytes(r.get('disk_after_consume_apparent_bytes'))})"),
            ("RSS after consume", fmt_bytes(r.get("rss_after_consume_bytes"))),
        ]
    probs = r.get("broker_log_problems") or []
    rows.append(("broker log errors", f"{len(probs)}" + (f" (first: {probs[0][:100]})" if probs else "")))
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--broker", choices=["warren", "rabbitmq"], required=True)
    ap.add_argument("--port", type=int, help="AMQP port (warren 5698, rabbitmq 5699)")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100, help="body size in bytes")
    ap.add_argument("--queues", type=int, default=1, help="durable queues the messages are spread over")
    ap.add_argument("--max-priority", type=int, help="priority queues (x-max-priority) with messages of every level")
    ap.add_argument("--queue-type", choices=["classic", "quorum", "stream"], default="classic",
                    help="x-queue-type of the queues (a stream is read from first by --consume, not drained)")
    ap.add_argument("--max-unconfirmed", type=int, default=10_000)
    ap.add_argument("--consume", action="store_true", help="consume + ack everything afterwards")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between last confirm and RSS/disk reading")
    ap.add_argument("--compact-wait", type=float, default=10.0, help="seconds after consuming before the disk reading")
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--publish-timeout", type=float, default=1800.0)
    ap.add_argument("--recovery-timeout", type=float, default=600.0)
    ap.add_argument("--consume-timeout", type=float, default=1800.0)
    ap.add_argument("--user", default="guest")
    ap.add_argument("--password", default="guest")
    ap.add_argument("--vhost", default="/")
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"),
                    help="interpreter for Warren")
    ap.add_argument("--log-level", default="INFO",
                    help="Warren log level (INFO, so the 'recovered N messages' line is logged)")
    ap.add_argument("--node", default=os.environ.get("BENCH_NODENAME", "bench-backlog@localhost"),
                    help="RabbitMQ node name")
    ap.add_argument("--dist-port", type=int, default=int(os.environ.get("BENCH_DIST_PORT", "25698")),
                    help="RabbitMQ Erlang distribution port")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.port is None:
        args.port = Warren.default_port if args.broker == "warren" else RabbitMQ.default_port
    if args.broker == "warren" and not os.path.exists(args.python):
        args.python = sys.executable

    # SIGTERM (e.g. from `timeout`) unwinds normally, so the node is still stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        res = run(args)
    except Exception as e:
        log(f"error: {type(e).__name__}: {e}")
        if args.json:
            print(json.dumps({"broker": args.broker, "error": f"{type(e).__name__}: {e}"}, indent=2))
        return 1
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
