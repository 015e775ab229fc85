def cmd_doctor(args):
    raise NotImplementedError
