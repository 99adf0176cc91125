"""One run of the harness: train one method with one seed, validate it during training, evaluate it on
the test split; and the start model (no RL) evaluated the same way."""

from __future__ import annotations

from pathlib import Path

from ..data.models import resolve_model
from ..data.tasks import get_task
from .presets import Budget, method_config

HEADLINE = ("accuracy", "auroc", "auroc_question", "ece")
START = "start (no RL)"


def headline(metrics: dict, n: int) -> dict:
    """The numbers a comparison reports, from an evaluation with ``n`` samples per problem."""
    return {"accuracy": metrics.get(f"mean@{n}"), "auroc": metrics.get("auroc"),
            "auroc_question": metrics.get("auroc_question"), "ece": metrics.get("ece")}


def _reward(budget: Budget):
    from .. import rewards

    reward = getattr(rewards, get_task(budget.task).reward or "math_accuracy_reward")  # the task's, by name
    return rewards.with_grader_noise(reward, budget.grader_noise) if budget.grader_noise else reward


def start_model(budget: Budget) -> str:
    """The model every run starts from: ``budget.model``, else the start model shipped with the budget's task."""
    return resolve_model(budget.model, "--model") or get_task(budget.task).model_path()


def evaluate_test(model, tokenizer, budget: Budget, seed: int, dataset=None):
    """``model`` on the budget's test split (temperature 1): an EvalResult.

    ``dataset(split, n, seed=...)`` gives the problems (default: those of the budget's task).
    """
    from ..evaluation.evaluate import evaluate

    problems = (dataset or get_task(budget.task).dataset)("test", budget.test_problems)
    return evaluate(model, tokenizer, problems, n=budget.test_samples, max_new_tokens=budget.max_completion_length,
                    temperature=1.0, seed=seed, progress=budget.progress)


def evaluate_start(budget: Budget):
    """The start model (no RL) on the test split, loaded as training loads it (fp32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = start_model(budget)
    return evaluate_test(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), budget,
                         seed=0)


def quiet_console(trainer, progress: bool) -> None:
    """A newcomer's console: a progress bar (or nothing), not a metric dict per logging step.

    The metrics still reach ``trainer.state.log_history``, the report and ``report_to``; only the
    console printing of TRL/transformers' progress and printer callbacks is replaced.
    """
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    class BarOnly(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            pass

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if progress:
        trainer.add_callback(BarOnly())


def train_method(overrides: dict, seed: int, budget: Budget, out_dir: Path, dataset=None, on_trainer=None):
    """Train one method with one seed; returns (trainer, validation history, test EvalResult).

    ``dataset(split, n, seed=...)`` gives the train, validation and test problems (default: those
    of the budget's task);
    ``on_trainer(trainer)``, if given, runs before training (an experiment's instrumentation).
    """
    from transformers import AutoTokenizer

    from ..evaluation.callbacks import CalibrationCallback
    from ..training.trainer import CAPOTrainer

    model = start_model(budget)
    dataset = dataset or get_task(budget.task).dataset
    args = method_config(overrides, seed, budget, out_dir)
    train = dataset("train", budget.train_problems, seed=seed)
    trainer = CAPOTrainer(model=model, reward_funcs=_reward(budget), args=args, train_dataset=train)
    monitor = CalibrationCallback(dataset("validation", budget.val_problems), every_n_steps=budget.val_every,
                                  n=budget.val_samples, seed=seed)
    trainer.add_callback(monitor.bind(trainer))
    quiet_console(trainer, budget.progress)
    if on_trainer is not None:
        on_trainer(trainer)
    trainer.train()
    tokenizer = AutoTokenizer.from_pretrained(model)
    return trainer, monitor.history, evaluate_test(trainer.model, tokenizer, budget, seed, dataset)


__all__ = ["HEADLINE", "START", "evaluate_start", "evaluate_test", "headline", "start_model", "train_method"]
