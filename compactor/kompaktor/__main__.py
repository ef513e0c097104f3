from kompaktor.cli import main

main()
