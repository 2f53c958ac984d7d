"""Recipes: a YAML chain of stages, validated as a DAG before anything runs, executed with caching."""

from trace_cli.recipes.model import Recipe, Step, load_recipe
from trace_cli.recipes.runner import StepReport, recipe_status, run_recipe

__all__ = ["Recipe", "Step", "StepReport", "load_recipe", "recipe_status", "run_recipe"]
