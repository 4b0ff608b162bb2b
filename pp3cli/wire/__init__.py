"""Draft frames on the wire: the frame codec, the fail-closed receiver, the drafter proxy."""
