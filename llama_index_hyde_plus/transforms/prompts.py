"""Default prompts. Each is a ``str.format`` template with a ``{query}`` field.

Swap one on an instance with ``update_prompts({"<key>": PromptTemplate(...)})``; the
keys are listed by ``get_prompts()``.
"""

from __future__ import annotations

HYDE_PROMPT = (
    "Please write a passage to answer the question. Write it as the passage of a "
    "document that answers it, stating facts plainly, without hedging or saying you "
    "are unsure.\n"
    "Question: {query}\n"
    "Passage:"
)
"""`HyDE`'s default prompt (key ``hyde_prompt``): one passage, stated plainly."""

HYDE_PAPER_PROMPTS: dict[str, str] = {
    "web-search": "Please write a passage to answer the question.\nQuestion: {query}\nPassage:",
    "scifact": (
        "Please write a scientific paper passage to support/refute the claim.\n"
        "Claim: {query}\nPassage:"
    ),
    "arguana": "Please write a counter argument for the passage.\nPassage: {query}\n"
    "Counter Argument:",
    "trec-covid": (
        "Please write a scientific paper passage to answer the question.\n"
        "Question: {query}\nPassage:"
    ),
    "fiqa": "Please write a financial article passage to answer the question.\n"
    "Question: {query}\nPassage:",
    "dbpedia-entity": "Please write a passage to answer the question.\nQuestion: {query}\nPassage:",
    "trec-news": "Please write a news passage about the topic.\nTopic: {query}\nPassage:",
}
"""The task-specific instructions of the HyDE paper (Gao et al., 2022, "Precise
Zero-Shot Dense Retrieval without Relevance Labels", appendix), keyed by task.
Use one with ``HyDE(prompt=HYDE_PAPER_PROMPTS["scifact"])``."""

MULTI_QUERY_PROMPT = (
    "You help a search engine find documents. Write {n} different search queries "
    "that ask for the same information as the question below, each worded "
    "differently (synonyms, other phrasings, more specific terms).\n"
    "Reply with one query per line, numbered 1 to {n}, and nothing else.\n\n"
    "Question: {query}\n"
    "Queries:"
)
"""`MultiQuery`'s default prompt (key ``multi_query_prompt``); ``{n}`` is its ``n``."""

STEP_BACK_PROMPT = (
    "You are an expert at world knowledge. Take a step back from the specific question "
    "below and ask the more general question about the principle, concept or "
    "background it depends on. Reply with the step-back question only.\n\n"
    "Question: {query}\n"
    "Step-back question:"
)
"""`StepBack`'s default prompt (key ``step_back_prompt``; Zheng et al., 2023)."""

DECOMPOSE_PROMPT = (
    "Break the question below into at most {n} simpler sub-questions that can each be "
    "answered by searching on its own, and that together answer the question. If it is "
    "already simple, reply with it alone.\n"
    "Reply with one sub-question per line, numbered, and nothing else.\n\n"
    "Question: {query}\n"
    "Sub-questions:"
)
"""`Decompose`'s default prompt (key ``decompose_prompt``); ``{n}`` is its ``n``."""

REWRITE_PROMPT = (
    "Rewrite the search query below so that a search engine finds the right documents: "
    "fix spelling, expand abbreviations, remove filler words and make it specific. Keep "
    "its meaning. Reply with the rewritten query only.\n\n"
    "Query: {query}\n"
    "Rewritten query:"
)
"""`Rewrite`'s default prompt (key ``rewrite_prompt``)."""

GROUNDING_PREFIX = (
    "Passages from the collection that may be relevant:\n{context}\n\n"
    "Use the passages above where they help.\n"
)
"""Put before the HyDE prompt by ``HyDE(grounded=k)``: the question's own top hits, so a
small model writes from the collection instead of from memory (Jagerman et al., 2023:
under 1B parameters, only retrieval-grounded prompts helped)."""

CONDENSE_PROMPT = (
    "Given the conversation below and a follow-up message, rewrite the follow-up "
    "message as one standalone search query that can be understood without the "
    "conversation: replace words such as it, they, this or that with what they refer "
    "to, and keep its meaning. If it already stands alone, repeat it. Reply with the "
    "standalone query only.\n\n"
    "Conversation:\n{history}\n\n"
    "Follow-up message: {query}\n"
    "Standalone query:"
)
"""`Condense`'s default prompt (key ``condense_prompt``); ``{history}`` is the bounded
conversation, one ``User:`` / ``Assistant:`` line per message."""
