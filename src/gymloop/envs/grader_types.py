"""The graders' types: one pydantic model per grader type, discriminated on `type` (OpenAI's
shapes). The fine-tuning API's request bodies, the `graded` environment's config and
envs/graders.py (which runs them) all take these; a dict becomes one through graders.parse."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator


class _Grader(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("", max_length=256, description="The grader's name (a multi grader's formula uses its key).")


class StringCheckGrader(_Grader):
    type: Literal["string_check"]
    input: str = Field(description="Template, e.g. {{sample.output_text}}.")
    reference: str = Field(description="Template, e.g. {{item.answer}}.")
    operation: Literal["eq", "ne", "like", "ilike"]


class TextSimilarityGrader(_Grader):
    type: Literal["text_similarity"]
    input: str
    reference: str
    evaluation_metric: Literal["fuzzy_match", "bleu", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5",
                               "rouge_l"]


class PythonGrader(_Grader):
    type: Literal["python"]
    source: str = Field(max_length=1 << 20, description="Defines grade(sample, item) -> float in [0, 1]; run in "
                        "gymloop's sandbox.")
    image_tag: str | None = Field(None, description="Accepted for compatibility; the sandbox's Python runs it.")


class ModelMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str
    type: Literal["message"] | None = None


class ScoreModelGrader(_Grader):
    type: Literal["score_model"]
    model: str = Field(min_length=1, description="A model this server serves (the base or one of yours).")
    input: list[ModelMessage] = Field(min_length=1, description="Messages with templates; the reply is the score.")
    range: Annotated[list[StrictFloat | StrictInt], Field(min_length=2, max_length=2, json_schema_extra={
        "uniqueItems": True})] | None = Field(
        None, description="[the score that maps to 0, the score that maps to 1] (default [0, 1]; two different "
        "numbers: [10, 0] rewards low scores).")

    @field_validator("range")
    @classmethod
    def _two_bounds(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and value[0] == value[1]:
            raise ValueError("range needs two different numbers")
        return value
    sampling_params: dict[str, Any] | None = Field(None, description="temperature, top_p, seed, "
                                                   "max_completions_tokens.")


# a multi grader's parts: any grader but another multi (as OpenAI's)
SubGrader = Annotated[StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader,
                      Field(discriminator="type")]


class MultiGrader(_Grader):
    type: Literal["multi"]
    graders: Annotated[dict[str, SubGrader], Field(min_length=1)] | SubGrader = Field(
        description="Named sub-graders (or one grader, named by its name, as the openai client types it).")
    calculate_output: str = Field(min_length=1, description="A formula of the names: numbers, + - * /, min max abs.")


Grader = Annotated[StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | MultiGrader,
                   Field(discriminator="type")]
