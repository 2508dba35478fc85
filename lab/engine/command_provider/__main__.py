"""``python -m lab.engine.command_provider <engine address>``: serve the stand-in plugin."""

from .server import main

if __name__ == "__main__":
    main()
