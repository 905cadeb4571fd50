#!/usr/bin/python3
"""bench_remote_launch: connection and launch time of a run with 4 ranks on 2 hosts over SSH, against ssh by hand.

Two OpenSSH servers on 127.0.0.2 and 127.0.0.3 (started here, with their own keys, stopped at the
end) stand for two hosts, reached through ssh config aliases from a private $HOME. Side by side,
alternated, in this script:

  lathectl   `lathectl train --hosts gpu-a:2,gpu-b:2` (digits, 1 epoch): from the command's start
             until every rank has printed its first line, as the launcher logs it ("launch timing:
             hosts checked in A ms, run files staged in B ms, all 4 ranks running C ms later; T ms
             in all"). That covers connecting to both hosts, checking key, login and lathectl
             there, uploading the config by SFTP (SHA-256 checked), and one SSH connection and
             worker start per rank.
  ssh x4     what one does by hand: `ssh gpu-a lathectl --version` twice and `ssh gpu-b ...` twice,
             one after the other (a fresh connection each, as four terminals would), from the
             first start to the last exit. No checks, no files, nothing supervised.

It prints the medians and the ratio lathectl / ssh x4. Exit codes: 0 measured, 1 something broke,
2 bad arguments, 77 no sshd or ssh client here (skipped).
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SSHD = "/usr/sbin/sshd"


def free_port(address):
    s = socket.socket()
    s.bind((address, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_sshd(root, address):
    d = os.path.join(root, address)
    os.makedirs(d)
    for key in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(d, key)], check=True)
    shutil.copy(os.path.join(d, "client.pub"), os.path.join(d, "authorized_keys"))
    port = free_port(address)
    with open(os.path.join(d, "sshd_config"), "w") as f:
        f.write("ListenAddress %s\nPort %d\nHostKey %s\nAuthorizedKeysFile %s\nPidFile %s\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
                "StrictModes no\nUsePAM no\nSubsystem sftp internal-sftp\n"
                % (address, port, os.path.join(d, "host"), os.path.join(d, "authorized_keys"),
                   os.path.join(d, "sshd.pid")))
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen([SSHD, "-f", os.path.join(d, "sshd_config"), "-D", "-e"],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "log"), "w"))
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection((address, port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise SystemExit("bench_remote_launch: sshd on %s did not start" % address)
    with open(os.path.join(d, "host.pub")) as f:
        host_key = f.read().strip()
    return proc, port, os.path.join(d, "client"), host_key


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lathectl", required=True)
    ap.add_argument("--out", help="directory for bench-DATE.log lines (appended)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    a = ap.parse_args()
    a.lathectl = os.path.abspath(a.lathectl)
    if not os.access(SSHD, os.X_OK) or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        print("bench_remote_launch: skipped: needs openssh-server and openssh-client")
        return 77
    repeats = 3 if a.quick else a.repeats
    root = tempfile.mkdtemp(prefix="lathe-bench-remote-")
    servers = []
    try:
        home = os.path.join(root, "home")
        os.makedirs(os.path.join(home, ".ssh"))
        user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        config, known = "", ""
        for name, address in (("gpu-a", "127.0.0.2"), ("gpu-b", "127.0.0.3")):
            proc, port, key, host_key = start_sshd(root, address)
            servers.append(proc)
            config += "Host %s\n  HostName %s\n  Port %d\n  User %s\n  IdentityFile %s\n" % (name, address, port, user, key)
            known += "[%s]:%d %s\n" % (address, port, host_key)
        with open(os.path.join(home, ".ssh", "config"), "w") as f:
            f.write(config)
        with open(os.path.join(home, ".ssh", "known_hosts"), "w") as f:
            f.write(known)
        env = dict(os.environ, HOME=home)
        env.pop("SSH_AUTH_SOCK", None)
        db = os.path.join(root, "lathe.db")
        for name in ("gpu-a", "gpu-b"):
            subprocess.run([a.lathectl, "hosts", "add", name, "--address", name, "--slots", "2", "--lathectl",
                            a.lathectl, "--db", db], env=env, check=True, capture_output=True)

        def by_hand():
            start = time.perf_counter()
            for name in ("gpu-a", "gpu-a", "gpu-b", "gpu-b"):
                # OpenSSH reads the passwd home's ~/.ssh, not $HOME's: name the files.
                p = subprocess.run(["ssh", "-F", os.path.join(home, ".ssh", "config"), "-o", "BatchMode=yes",
                                    "-o", "UserKnownHostsFile=" + os.path.join(home, ".ssh", "known_hosts"),
                                    name, a.lathectl, "--version"], env=env,
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    raise SystemExit("bench_remote_launch: ssh %s failed: %s" % (name, p.stderr.strip()))
            return (time.perf_counter() - start) * 1000

        def launch():
            p = subprocess.run([a.lathectl, "train", "--epochs", "1", "--threads", "1", "--checkpoint-every", "0",
                                "-q", "--json", "--hosts", "gpu-a:2,gpu-b:2", "--db", db], env=env,
                               capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit("bench_remote_launch: lathectl train --hosts failed: %s %s" % (p.stderr.strip(), p.stdout))
            run_id = json.loads(p.stdout)["run_id"]
            show = subprocess.run([a.lathectl, "runs", "show", str(run_id), "--json", "--db", db], env=env,
                                  capture_output=True, text=True, check=True)
            for log in json.loads(show.stdout)["logs"]:
                m = re.search(r"launch timing: hosts checked in (\d+) ms, run files staged in (\d+) ms, "
                              r"all 4 ranks running (\d+) ms later; (\d+) ms in all", log["msg"])
                if m:
                    return [int(x) for x in m.groups()]
            raise SystemExit("bench_remote_launch: run %s logged no launch timing" % run_id)

        launch()  # warm the page cache and the hosts' sshd
        by_hand()
        ours, theirs = [], []
        for _ in range(repeats):
            ours.append(launch())
            theirs.append(by_hand())
        med = [statistics.median(x[i] for x in ours) for i in range(4)]
        hand = statistics.median(theirs)
        lines = [
            "bench_remote_launch: 4 ranks on 2 hosts (sshd on 127.0.0.2 and 127.0.0.3), median of %d alternated" % repeats,
            "  lathectl train --hosts gpu-a:2,gpu-b:2: %.0f ms until all 4 ranks run (checks %.0f ms, staging %.0f ms, "
            "connect + start %.0f ms)" % (med[3], med[0], med[1], med[2]),
            "  ssh x4 by hand (lathectl --version, one after the other): %.0f ms" % hand,
            "  ratio lathectl / ssh x4: %.2f" % (med[3] / hand),
        ]
        print("\n".join(lines))
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "bench-%s.log" % time.strftime("%Y-%m-%d")), "a") as f:
                f.write("\n".join(lines) + "\n")
        return 0
    finally:
        for p in servers:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
