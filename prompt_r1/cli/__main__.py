"""`python -m prompt_r1.cli`: the library's commands, without the orchestrated ones."""

from prompt_r1.cli import main

main()
