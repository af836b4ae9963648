"""Command-line tools: `torchneuron doctor | run | verify | ops` (see docs/CLI.md)."""
