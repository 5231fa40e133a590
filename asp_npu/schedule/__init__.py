"""The offline ASP planner: padding (grouping), skewness (balancing), sorting (ordering)."""
