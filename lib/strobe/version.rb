# frozen_string_literal: true

module Strobe
  VERSION = "0.1.0"
end
