"""The training-backend contract and the helpers backends share."""
