"""Reuse: how much of a prompt is kept (plan), where its prefix comes from (router, over the
tiers), bringing it into the slot (prefix), moving sequence state (memory), the client
sessions at work (sessions)."""
