"""Workers of the platform: rollout servers and learners, one of each per policy."""
