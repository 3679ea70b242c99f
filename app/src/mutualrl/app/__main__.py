from mutualrl.app.cli import main

main()
