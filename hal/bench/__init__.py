"""`hal bench`: times kernels side by side with their baselines, against ceilings measured in the
same run."""
