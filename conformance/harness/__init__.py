"""The conformance suite's runner (SPEC section 10 of the contract, in docs/conformance.md).

Modules, one concern each:

- ``driver``: one driver process (the client under test), its JSON lines,
  answers matched by id, events queued;
- ``nodes``: real ``batond`` processes on loopback ports (single, cluster,
  auth, TLS), started, killed, stopped, restarted, handed over;
- ``scripted``: the scripted node, a small lock server of the runner's own
  that misbehaves on cue and logs what it saw on the wire;
- ``pki``: throwaway test certificates (the ``openssl`` command);
- ``matching``: how an expected value in a scenario matches a result;
- ``scenario``: loading a scenario file and playing its steps;
- ``wire``: the checks over the scripted node's wire log.

Standard library only: the runner must start on any machine the README's
set-up leaves (Python 3.11 with nothing installed).
"""
