from ovq_cl.ops.ssm.naive import SSMState, simple_gla_chunked, simple_gla_recurrent

__all__ = ["SSMState", "simple_gla_chunked", "simple_gla_recurrent"]
