"""What the ``stopline`` command line runs besides ``replay``: the live demo
(:mod:`stopline.tools.generate`), the SmolLM2 model download it needs
(:mod:`stopline.tools.models`) and the benchmark suite
(:mod:`stopline.tools.bench`).

Not part of the library: ``import stopline`` never imports this package, only
the command line does, and its modules may change in any release. They need
the ``demo`` or ``bench`` extra; without it a subcommand says which extra to
install and exits with status 2.
"""
