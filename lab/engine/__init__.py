"""The lab's stand-ins for the two engine parts no registry serves (docs/development.md)."""
