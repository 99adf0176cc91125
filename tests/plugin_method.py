"""A method defined outside capo-trl, as a user would write one (used by test_methods.py)."""

from dataclasses import dataclass

from capo_trl.methods import Method


@dataclass
class ScaledArgs:
    scale: float = 1.0


class ScaledGRPO(Method):
    """GRPO's advantages times a constant: the smallest method with a setting of its own."""

    name = "scaled_grpo"
    Args = ScaledArgs

    @classmethod
    def validate(cls, args, prefix="CAPOConfig.method_kwargs."):
        if not args.scale > 0:
            raise ValueError(f"{prefix}scale={args.scale!r} is invalid; it must be > 0.")

    def advantages(self, batch):
        return batch.trl_advantages * self.args.scale, {"plugin/scale": self.args.scale}
