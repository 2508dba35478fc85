"""What the components render: argv lists and POSIX sh scripts, pure (spec in, text out),
per backend in backends/."""
