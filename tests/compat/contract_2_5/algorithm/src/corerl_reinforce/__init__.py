"""corerl-reinforce: REINFORCE with a running-mean baseline."""
