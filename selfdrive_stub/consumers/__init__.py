"""The safety consumers that gate model output: dmonitoringd (with its policy, dm_policy) and selfdrived."""
