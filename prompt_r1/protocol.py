"""The Prompt-R1 multi-turn protocol as pure text functions.

The agent sees `Question: <q>` plus the instruction text below. Each agent turn is either
`<think>..</think><interaction_prompt>..</interaction_prompt>` (ask the environment LLM) or
`<think>..</think><answer>..</answer>` (finish). Environment replies come back wrapped in
`<interaction_response>` tags. The environment itself sees a plain chat: the agent's earlier
interaction prompts as user turns, its own earlier replies as assistant turns, then the new
prompt. Reward, rollout and evaluation all parse turns through this one module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Verbatim from the reference release (every Parquet prompt ends with exactly this text).
INSTRUCTION = (
    "First, provide a simple explanation of the question and give it to the large language model "
    "for a more accurate answer. Focus on explaining the question without deep reasoning in the "
    "first step. After receiving the response, think about the large language model's response, "
    "and by interacting with the large language model again and again, arrive at the final answer. "
    "Proceed step by step with the following rules:\n"
    "1. Only in the first step, provide a brief explanation of the question and give it to the "
    "large language model:\n"
    "   <think>(Brief thinking must not be over 80 words)</think>\n"
    "   <interaction_prompt>(give the question and its explanation to the large language model)"
    "</interaction_prompt>\n"
    "2. After the first step, in each interaction with the large language model, write:\n"
    "   <think>(your reasoning for the receiving response and question)</think>\n"
    "   <interaction_prompt>(new request to refine or validate the answer)</interaction_prompt>\n"
    "3. Each <interaction_prompt> must build on what came before. Do not just repeat the same "
    "content. Let the content of the <interaction_prompt>...</interaction_prompt> evolve naturally "
    "(for example: outline \u2192 add details \u2192 refine \u2192 check). \n"
    "4. Continue producing think within <think></think> and call tool within "
    "<interaction_prompt></interaction_prompt> until the answer is ready.\n"
    "5. Once the answer is complete, write:\n"
    "   <think>(final reasoning with the <interaction_response> and question)</think>\n"
    "   <answer>(final answer for the question)</answer>"
)
INSTRUCTION_MARKER = "First, provide a simple explanation"

# Strings that end an agent turn during generation.
STOP_STRINGS = ("</interaction_prompt>", "</answer>")

_TAG = r"<{0}>(.*?)</{0}>"
_INTERACTION_TURN = re.compile(r"^\s*<think>(.*?)</think>\s*<interaction_prompt>(.*?)</interaction_prompt>\s*$", re.S)
_ANSWER_TURN = re.compile(r"^\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*$", re.S)
_TAGS = ("think", "interaction_prompt", "answer")


@dataclass(frozen=True)
class AgentTurn:
    """One agent message split into its parts (None where a tag is absent)."""

    think: str | None
    interaction_prompt: str | None
    answer: str | None

    @property
    def kind(self) -> str:
        """`answer`, `interaction`, or `invalid` (what the rollout loop does next)."""
        if self.answer is not None:
            return "answer"
        if self.interaction_prompt is not None:
            return "interaction"
        return "invalid"


def build_agent_prompt(question: str) -> str:
    """The user message the agent sees.

    >>> build_agent_prompt("Who wrote Hamlet?").splitlines()[0]
    'Question: Who wrote Hamlet?'
    """
    return f"Question: {question.strip()}\n{INSTRUCTION}"


def split_question(prompt_text: str) -> str:
    """Recover the bare question from a Prompt-R1 prompt (inverse of `build_agent_prompt`).

    >>> split_question(build_agent_prompt("What is 2+2?"))
    'What is 2+2?'
    """
    head = prompt_text.split(INSTRUCTION_MARKER, 1)[0]
    head = head.strip()
    if head.startswith("Question:"):
        head = head[len("Question:") :]
    return head.strip()


def _last(tag: str, text: str) -> str | None:
    found = re.findall(_TAG.format(tag), text, re.S)
    return found[-1] if found else None


def parse_turn(text: str) -> AgentTurn:
    """Split an agent message into think / interaction_prompt / answer (last occurrence wins).

    An `<answer>` takes precedence over an interaction prompt in the same message.

    >>> parse_turn("<think>hm</think><interaction_prompt>Ask X</interaction_prompt>").kind
    'interaction'
    >>> parse_turn("<think>ok</think><answer> Paris </answer>").answer
    ' Paris '
    >>> parse_turn("no tags").kind
    'invalid'
    """
    return AgentTurn(_last("think", text), _last("interaction_prompt", text), _last("answer", text))


def _one_of_each(text: str, tags: tuple[str, ...]) -> bool:
    for tag in _TAGS:
        want = 1 if tag in tags else 0
        if text.count(f"<{tag}>") != want or text.count(f"</{tag}>") != want:
            return False
    return True


def is_interaction_turn(text: str) -> bool:
    """Exactly one `<think>` block then one `<interaction_prompt>` block, nothing else.

    >>> is_interaction_turn("<think>a</think>\\n<interaction_prompt>b</interaction_prompt>")
    True
    >>> is_interaction_turn("<think>a</think><interaction_prompt>b</interaction_prompt> extra")
    False
    """
    return bool(_INTERACTION_TURN.match(text)) and _one_of_each(text, ("think", "interaction_prompt"))


def is_answer_turn(text: str) -> bool:
    """Exactly one `<think>` block then one `<answer>` block, nothing else.

    >>> is_answer_turn("<think>a</think> <answer>b</answer>")
    True
    >>> is_answer_turn("<answer>b</answer>")
    False
    """
    return bool(_ANSWER_TURN.match(text)) and _one_of_each(text, ("think", "answer"))


def extract_answer(final_turn: str) -> str:
    """The answer text of the agent's final turn, stripped ('' when it gave none).

    >>> extract_answer("<think>x</think><answer> 42 </answer>")
    '42'
    >>> extract_answer("<think>x</think>")
    ''
    """
    answer = parse_turn(final_turn).answer
    return answer.strip() if answer is not None else ""


def wrap_env_reply(reply: str) -> str:
    """How an environment reply is appended to the agent's context.

    >>> wrap_env_reply("Paris.")
    '\\n<interaction_response>Paris.</interaction_response>\\n'
    """
    return f"\n<interaction_response>{reply}</interaction_response>\n"


def env_messages(prompts: list[str], replies: list[str]) -> list[dict[str, str]]:
    """Chat history sent to the environment: prompts as user turns, its replies as assistant turns.

    `prompts` holds every interaction prompt so far including the new one (one more than `replies`).

    >>> env_messages(["q1", "q2"], ["a1"])
    [{'role': 'user', 'content': 'q1'}, {'role': 'assistant', 'content': 'a1'}, {'role': 'user', 'content': 'q2'}]
    """
    if len(prompts) != len(replies) + 1:
        raise ValueError(f"need one more prompt than replies, got {len(prompts)} and {len(replies)}")
    messages: list[dict[str, str]] = []
    for i, prompt in enumerate(prompts):
        messages.append({"role": "user", "content": prompt.strip()})
        if i < len(replies):
            messages.append({"role": "assistant", "content": replies[i]})
    return messages
