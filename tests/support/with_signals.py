#!/usr/bin/env python3
"""Runs a command with the signal dispositions and mask a harness might pass down.

A process inherits across exec the signals its parent ignored and its blocked signal mask. A
CI runner, a Python harness (Python ignores SIGPIPE and restores it only when asked), nohup or
a container init can all leave some ignored or blocked, so a test suite that depends on the
default actions passes in one place and fails in another. This wrapper sets them explicitly so
both cases can be reproduced from any shell:

  tests/support/with_signals.py --default PIPE -- ctest --test-dir build -R PeerFailure
  tests/support/with_signals.py --ignore PIPE,INT,TERM --block TERM,USR1 -- build/tests/...

--default resets the named signals to their default action, --ignore sets them to be ignored,
--block adds them to the blocked mask (--unblock-all clears it first). Signal names are given
without the SIG prefix. The command is exec'd, so it keeps this process id.
"""
import argparse
import os
import signal
import sys


def signals(names):
    out = []
    for name in filter(None, (names or "").split(",")):
        try:
            out.append(getattr(signal, "SIG" + name.strip().upper()))
        except AttributeError:
            sys.exit(f"with_signals.py: unknown signal '{name}'; use names like PIPE, TERM, INT")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--default", help="signals reset to their default action, e.g. PIPE")
    parser.add_argument("--ignore", help="signals set to be ignored, e.g. PIPE,INT,TERM")
    parser.add_argument("--block", help="signals added to the blocked mask, e.g. TERM,USR1")
    parser.add_argument("--unblock-all", action="store_true", help="clear the mask first")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command; put it after --")
    for s in signals(args.default):
        signal.signal(s, signal.SIG_DFL)
    for s in signals(args.ignore):
        signal.signal(s, signal.SIG_IGN)
    if args.unblock_all:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if args.block:
        signal.pthread_sigmask(signal.SIG_BLOCK, signals(args.block))
    try:
        os.execvp(command[0], command)
    except OSError as e:
        sys.exit(f"with_signals.py: cannot run {command[0]}: {e.strerror}")


if __name__ == "__main__":
    main()
