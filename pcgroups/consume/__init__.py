"""Consuming a member's consumer: the options, the pull loop, the dispatchers and the message a handler gets.

A member instance (:class:`ConsumerInstance`, ``_instance``, on the ``ControlLoop`` of ``_loop``) runs one
pull session (``_session``): pinned pulls, ``+WPI``, drain. What arrives goes to its ``Delivery``
(``_delivery``: the buffer, the pin, take-overs, epochs), from which a dispatcher (``_dispatchers``: one
handler at a time, or key-level concurrency by a key function of ``_keys``, retrying by the
:class:`RetryPolicy` of ``_retry``, holding the adaptive window of ``_window``) hands :class:`Msg` to the
handler (``_msg``: the message a handler gets, and its acks). How it consumes is one :class:`ConsumeOptions` (``_options``), which also makes the dispatcher.
``_report`` tells the owner what happens (events, rebalance hooks); ``_handoff`` is ``async for``.
"""

from ._dispatchers import Handler
from ._instance import ConsumerInstance, member_template, with_priority_group
from ._keys import KeyFunc, key_by_header, key_by_partitioning, key_by_subject, key_by_tokens
from ._loop import ConsumeContext
from ._msg import Msg
from ._options import ConsumeOptions
from ._retry import RetryPolicy
from ._window import FAIR_WINDOW

__all__ = [
    "FAIR_WINDOW",
    "ConsumeContext",
    "ConsumeOptions",
    "ConsumerInstance",
    "Handler",
    "KeyFunc",
    "Msg",
    "RetryPolicy",
    "key_by_header",
    "key_by_partitioning",
    "key_by_subject",
    "key_by_tokens",
    "member_template",
    "with_priority_group",
]
