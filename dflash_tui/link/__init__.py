"""Transports to the agent: a local subprocess, or one SSH connection (asyncssh)."""

import warnings

# cryptography 51 deprecates DSA, and asyncssh 2.24 names DSA types at import: ten lines of
# CryptographyDeprecationWarning on stderr before every command's one line. Only those,
# only from asyncssh: they are about its type annotations, not about any key in use.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")
