"""The polyspec registry: verifiers, drafts, evaluations, deployments, language profiles, live stats.

Torch-free at import: model code is loaded only inside the operations that need it.
"""

from polyspec.registry.errors import (
    AlreadyExists, ImportFailed, InvalidDraft, InvalidEvaluation, NotFound, PromotionRefused, PromptsError,
    RegistryError, RegistryMissing, UnknownLanguage,
)
from polyspec.registry.records import (
    DeploymentView, DraftRecord, EvaluationRecord, EventRecord, LanguageProfileRecord, LiveStatRecord,
    PromotionResult, VerifierRecord,
)
from polyspec.registry.store import Registry, open_registry, parse_ref

__all__ = [
    "AlreadyExists", "DeploymentView", "DraftRecord", "EvaluationRecord", "EventRecord", "ImportFailed",
    "InvalidDraft", "InvalidEvaluation", "LanguageProfileRecord", "LiveStatRecord", "NotFound", "PromotionRefused",
    "PromotionResult", "PromptsError", "Registry", "RegistryError", "RegistryMissing", "UnknownLanguage", "VerifierRecord",
    "open_registry", "parse_ref",
]
