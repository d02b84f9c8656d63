"""Checkpoints: one prefix per step, written completely before a manifest that marks it complete."""
