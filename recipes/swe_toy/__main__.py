from recipes.swe_toy.cli import main

main(prog_name="python -m recipes.swe_toy")
