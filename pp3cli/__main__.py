from pp3cli.cli import main

main()
