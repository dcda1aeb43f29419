"""Sampling: the sampler chain, GBNF grammars and JSON-schema-constrained output."""

from pyengine.sample.chain import SamplerChain
from pyengine.sample.grammar import Grammar, GrammarMatcher
from pyengine.sample.json_schema import schema_to_grammar
from pyengine.sample.options import OPTION_NAMES, SAMPLER_NAMES, SamplingOptions

__all__ = ["Grammar", "GrammarMatcher", "OPTION_NAMES", "SAMPLER_NAMES", "SamplerChain", "SamplingOptions",
           "schema_to_grammar"]
