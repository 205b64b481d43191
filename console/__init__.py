"""The ``joms`` console: interactive and scripted publish/subscribe on a local JOMS daemon.

Layout: ``grammar`` (the one command grammar), ``selection`` (``-ssl`` patterns),
``link`` (the daemon connection and subscriptions), ``admin`` (the daemon's admin API),
``output`` (printing messages), ``commands`` (what each command does), ``interactive``
(prompt, history, completion) and ``cli`` (the ``joms`` entry point and its modes).
"""
