# frozen_string_literal: true

require "uri"

module Strobe
  # What a line Strobe writes (a warning, an error, an exception's message,
  # #inspect) may show of a URL or a credential: no user or password, no
  # query string, no fragment, no token.
  module Redact
    # A URL's scheme, and all up to its last "@" (a user and password,
    # which may hold "/", "?", "#", spaces or "@" when not percent-encoded).
    USERINFO = %r{\A([A-Za-z][A-Za-z0-9+.\-]*://)?.*@}m
    # A query string or a fragment, to the end.
    QUERY = /[?#].*\z/m

    module_function

    # url (a String or a URI, valid or not) as a line may show it: its user
    # and password as ***, its query and fragment as "?..." ("#...").
    #
    #   Redact.url("http://user:secret@host:4040/x?token=abc") # => "http://***@host:4040/x?..."
    def url(url)
      url.to_s.sub(USERINFO) { "#{Regexp.last_match(1)}***@" }.sub(QUERY) { |rest| "#{rest[0]}..." }
    end

    # What a URI::InvalidURIError says, without the URL it quotes
    # ("bad URI(is not URI?)").
    def uri_error(error)
      error.message[/\A[^:"]*/].to_s.strip
    end

    # The forms an Authorization header's value (Basic or Bearer) may be
    # quoted in: the whole value, its credentials, and for Basic the
    # decoded user:password and password; longest first.
    def authorization_forms(value)
      value = value.to_s
      scheme, credentials = value.split(" ", 2)
      forms = [value, credentials.to_s.strip]
      if scheme.to_s.casecmp?("basic")
        decoded = credentials.to_s.unpack1("m").to_s.dup.force_encoding(Encoding::UTF_8)
        forms.push(decoded, decoded.split(":", 2)[1].to_s) if decoded.valid_encoding?
      end
      # (and each percent-encoded, as a server may quote it from a URL or a form)
      forms += forms.flat_map do |form|
        encoded = URI.encode_www_form_component(form)
        [encoded, encoded.gsub("+", "%20")]
      end
      forms.reject(&:empty?).uniq.sort_by { |form| -form.length }
    end

    # text with each of secrets (Strings) in it as ***.
    def secrets(text, secrets)
      secrets.reduce(text.to_s) { |shown, secret| secret.empty? ? shown : shown.gsub(secret, "***") }
    end

    # An #inspect of object that shows only its class and the given fields
    # (names and values already safe to show).
    def inspect(object, **fields)
      shown = fields.map { |name, value| " #{name}=#{value.inspect}" }.join(",")
      "#<#{object.class.name}#{shown}>"
    end
  end
end
