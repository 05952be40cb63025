#!/usr/bin/env python3
"""Writes the seed corpus of wire_client_fuzz (corpus/wire_client/): what a real loomd sends.

Starts loomd (--insecure, on loopback, a temporary state directory) behind a recording TCP
proxy, makes loomctl calls through the proxy, and keeps the bytes loomd sent on each connection:
a whole HTTP/2 conversation (SETTINGS, HEADERS, DATA, trailers) for an answer with a message, a
trailers-only error, and a list. Two more seeds are not HTTP/2 at all. Needs the built binaries:
python3 tests/fuzz/make_wire_seeds.py [BIN_DIR (default build/bin)]
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "corpus", "wire_client")


def proxy(listener, upstream, recorded):
    """Serves one connection: forwards both ways, appends what upstream sent to `recorded`."""
    client, _ = listener.accept()
    server = socket.create_connection(upstream)

    def pump(src, dst, keep):
        while True:
            data = src.recv(65536)
            if not data:
                break
            if keep is not None:
                keep.append(data)
            dst.sendall(data)
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    up = threading.Thread(target=pump, args=(client, server, None))
    up.start()
    pump(server, client, recorded)
    up.join()
    client.close()
    server.close()


def call(bin_dir, upstream, args):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    recorded = []
    t = threading.Thread(target=proxy, args=(listener, upstream, recorded))
    t.start()
    port = listener.getsockname()[1]
    subprocess.run([os.path.join(bin_dir, "loomctl"), "--server", f"127.0.0.1:{port}"] + args,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t.join(timeout=10)
    listener.close()
    return b"".join(recorded)


def main():
    bin_dir = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin"))
    with tempfile.TemporaryDirectory() as tmp:
        ready = os.path.join(tmp, "ready")
        loomd = subprocess.Popen(
            [os.path.join(bin_dir, "loomd"), "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
             f"--state-dir={tmp}/state", f"--ready-file={ready}", "--insecure"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                if os.path.exists(ready) and os.path.getsize(ready) > 0:
                    break
                time.sleep(0.05)
            host, port = json.load(open(ready))["grpc"].rsplit(":", 1)
            upstream = (host, int(port))
            seeds = {
                "get_not_found": call(bin_dir, upstream, ["get", "jobs/no-such-job"]),
                "list_empty": call(bin_dir, upstream, ["list"]),
                "cancel_not_found": call(bin_dir, upstream, ["cancel", "jobs/gone"]),
            }
        finally:
            loomd.terminate()
            loomd.wait()
    seeds["http1_answer"] = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
    seeds["settings_cut_short"] = bytes.fromhex("000006040000000000")
    os.makedirs(OUT, exist_ok=True)
    for name, data in seeds.items():
        if not data:
            sys.exit(f"make_wire_seeds: nothing recorded for {name}")
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
