from stalldoc.cli import main

main()
