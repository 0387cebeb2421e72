"""Transports to the agent: a local subprocess, or one SSH connection (asyncssh)."""

import warnings

# asyncssh's own modules name cryptography's DSA classes in their type hints, and
# cryptography 51 warns at each: five CryptographyDeprecationWarning lines on stderr when
# asyncssh is imported, before a command's one line (and over the TUI's screen). They say
# nothing about the host or its key: silenced for asyncssh's modules only.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh\.")
