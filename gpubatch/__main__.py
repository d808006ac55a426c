from gpubatch.cli import main

main()
