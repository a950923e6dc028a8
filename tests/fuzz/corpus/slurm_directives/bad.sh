#DW stage_in source=rel destination=/x
#DW swap 1GiB
#DW jobdw capacity=big pool=
#DW
#DW jobdw type=cache access_mode=private
#DW stage_in type=file source=/a destination=${DW_JOB_STRIPED}/a/
