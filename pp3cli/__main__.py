from pp3cli.cli.app import main

main()
