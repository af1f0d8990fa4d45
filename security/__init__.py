"""How hetero's daemons and clients meet safely: TLS and mutual TLS, bearer tokens and
named credentials, the interceptor that makes every failure a deliberate status code,
and what a daemon does about users and file modes.

Below the coordinator, the agent, the trainer's control client and hetero-top (all of
which import it); it imports nothing of hetero's but ``hetero.core``.
"""
