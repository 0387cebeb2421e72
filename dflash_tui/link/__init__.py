"""Transports to the agent: a local subprocess, or one SSH connection (asyncssh)."""
