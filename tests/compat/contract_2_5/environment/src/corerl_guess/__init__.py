"""corerl-guess: guess the number, with hints."""
